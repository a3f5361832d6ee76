// stanvi_services.cpp: Stan's own algorithms (the stan::services layer CmdStan calls), run
// in-process on a stanvi-compiled model:
//   * NUTS with a diagonal or dense metric adapted during warmup,
//     `stan::services::sample::hmc_nuts_{diag,dense}_e_adapt` (Hoffman & Gelman 2014,
//     Betancourt 2017);
//   * ADVI, `stan::services::experimental::advi::{meanfield,fullrank}` (Kucukelbir et al. 2017);
//   * Pathfinder, `stan::services::pathfinder::pathfinder_lbfgs_{single,multi}`
//     (Zhang, Carpenter, Gelman & Vehtari 2022).
// Every algorithm sees the model through `CountingModel`, a model_base that forwards to the real
// model and counts log-density evaluations by scalar type (double = density only, var = one
// gradient, fvar<var> = one Hessian-vector product), so Stan's cost is reported in the same units
// as stanvi's oracle calls.  Results (draws, diagnostics, messages, counts) stay in memory: no CSV.
//
// Like stanvi_bridge.cpp, this file talks to the model only through `stan::model::model_base` and
// the stanc-emitted `new_model()` factory, so the services template is instantiated once, for
// model_base, exactly as CmdStan does; the object is compiled once per flag set and linked into an
// opt-in per-model services library (stanvi/stan/services_build.py), never into the ordinary
// model library.
//
// Error convention (as in stanvi_bridge.cpp): a function that can fail returns NULL or non-zero
// and sets `*err` (when err is not NULL) to a malloc'd message freed by
// `stanvi_services_free_error_msg`.  No C++ exception leaves this file.

#include <stan/model/model_header.hpp>
#include <stan/io/empty_var_context.hpp>
#include <stan/io/json/json_data.hpp>
#include <stan/callbacks/interrupt.hpp>
#include <stan/callbacks/logger.hpp>
#include <stan/callbacks/writer.hpp>
#include <stan/callbacks/structured_writer.hpp>
#include <stan/services/sample/hmc_nuts_diag_e_adapt.hpp>
#include <stan/services/sample/hmc_nuts_dense_e_adapt.hpp>
#include <stan/services/experimental/advi/meanfield.hpp>
#include <stan/services/experimental/advi/fullrank.hpp>
#include <stan/services/pathfinder/single.hpp>
#include <stan/services/pathfinder/multi.hpp>

#include <atomic>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

// Provided by the stanc-generated model code linked beside this file.
stan::model::model_base& new_model(stan::io::var_context& data_context, unsigned int seed,
                                   std::ostream* msg_stream);

namespace {

char* copy_message(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out != nullptr) std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

void set_error(char** err, const std::string& s) {
  if (err != nullptr) *err = copy_message(s);
}

std::unique_ptr<stan::io::var_context> parse_json(const char* json) {
  if (json == nullptr || json[0] == '\0') {
    return std::make_unique<stan::io::empty_var_context>();
  }
  std::istringstream in{std::string(json)};
  return std::make_unique<stan::json::json_data>(in);
}

#define STANVI_VAR_VECTOR Eigen::Matrix<stan::math::var, -1, 1>
#define STANVI_FVAR_VECTOR Eigen::Matrix<stan::math::fvar<stan::math::var>, -1, 1>

// Each thread that runs a chain needs its own autodiff tape (STAN_THREADS keeps it thread-local).
inline void ensure_autodiff_tape() {
  static thread_local stan::math::ChainableStack tape;
  (void)tape;
}

// Collects the header (column names) and the draws; string messages (adaptation summary, timing)
// are kept separately.
class MemoryWriter : public stan::callbacks::writer {
 public:
  std::vector<std::string> names;
  std::vector<double> values;  // row-major, names.size() per row
  std::vector<std::string> messages;
  long rows = 0;

  void operator()(const std::vector<std::string>& n) override {
    if (names.empty()) names = n;
  }
  void operator()(const std::vector<double>& state) override {
    values.insert(values.end(), state.begin(), state.end());
    ++rows;
  }
  void operator()(const Eigen::Matrix<double, 1, -1>& state) override {
    values.insert(values.end(), state.data(), state.data() + state.size());
    ++rows;
  }
  void operator()(const Eigen::Matrix<double, -1, 1>& state) override {
    values.insert(values.end(), state.data(), state.data() + state.size());
    ++rows;
  }
  void operator()(const Eigen::Matrix<double, -1, -1>& m) override {
    // One draw per row (the layout Stan's matrix writers use).
    for (Eigen::Index i = 0; i < m.rows(); ++i) {
      for (Eigen::Index j = 0; j < m.cols(); ++j) values.push_back(m(i, j));
      ++rows;
    }
  }
  bool is_valid() const noexcept override { return true; }
  void operator()(const std::string& message) override { messages.push_back(message); }
  void operator()() override {}
};

// Collects every message, tagged with its level.
class MemoryLogger : public stan::callbacks::logger {
 public:
  std::vector<std::string> lines;
  std::vector<std::string> errors;

  void debug(const std::string& m) override {}
  void debug(const std::stringstream& m) override {}
  void info(const std::string& m) override { add("info", m); }
  void info(const std::stringstream& m) override { add("info", m.str()); }
  void warn(const std::string& m) override { add("warn", m); }
  void warn(const std::stringstream& m) override { add("warn", m.str()); }
  void error(const std::string& m) override {
    add("error", m);
    std::lock_guard<std::mutex> guard(mutex_);
    errors.push_back(m);
  }
  void error(const std::stringstream& m) override { error(m.str()); }
  void fatal(const std::string& m) override {
    add("fatal", m);
    std::lock_guard<std::mutex> guard(mutex_);
    errors.push_back(m);
  }
  void fatal(const std::stringstream& m) override { fatal(m.str()); }

 private:
  void add(const char* level, const std::string& m) {
    if (m.empty()) return;
    std::lock_guard<std::mutex> guard(mutex_);  // multi-path Pathfinder logs from TBB threads
    lines.push_back(std::string(level) + ": " + m);
  }
  std::mutex mutex_;
};

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += sep;
    out += v[i];
  }
  return out;
}

}  // namespace


// A model_base that forwards every call to the real model and counts log-density evaluations by
// scalar type.  The services templates are instantiated for it, so every evaluation an algorithm
// makes passes through here (writes of constrained draws, `write_array`, are not counted: they
// are not oracle calls).
class CountingModel : public stan::model::model_base {
 public:
  explicit CountingModel(const stan::model::model_base& inner)
      : stan::model::model_base(inner.num_params_r()), inner_(inner) {}

  mutable std::atomic<long> density{0};   // log density only (double)
  mutable std::atomic<long> gradient{0};  // log density and gradient (reverse mode, var)
  mutable std::atomic<long> hvp{0};       // Hessian-vector products (fvar<var>)

  // The base's template `log_prob<propto, jacobian>` dispatchers stay visible beside the
  // overrides below (which would otherwise hide them).
  using stan::model::model_base::log_prob;

  std::string model_name() const override { return inner_.model_name(); }
  std::vector<std::string> model_compile_info() const override {
    return inner_.model_compile_info();
  }
  void get_param_names(std::vector<std::string>& names, bool tp = true,
                       bool gq = true) const override {
    inner_.get_param_names(names, tp, gq);
  }
  void get_dims(std::vector<std::vector<size_t>>& dims, bool tp = true,
                bool gq = true) const override {
    inner_.get_dims(dims, tp, gq);
  }
  void constrained_param_names(std::vector<std::string>& names, bool tp = true,
                               bool gq = true) const override {
    inner_.constrained_param_names(names, tp, gq);
  }
  void unconstrained_param_names(std::vector<std::string>& names, bool tp = true,
                                 bool gq = true) const override {
    inner_.unconstrained_param_names(names, tp, gq);
  }

#define STANVI_FORWARD_LOG_PROB(RET, ARG, COUNTER)                                       \
  RET log_prob(ARG& p, std::ostream* m) const override {                                 \
    ++COUNTER;                                                                           \
    return inner_.log_prob(p, m);                                                        \
  }                                                                                      \
  RET log_prob_jacobian(ARG& p, std::ostream* m) const override {                        \
    ++COUNTER;                                                                           \
    return inner_.log_prob_jacobian(p, m);                                               \
  }                                                                                      \
  RET log_prob_propto(ARG& p, std::ostream* m) const override {                          \
    ++COUNTER;                                                                           \
    return inner_.log_prob_propto(p, m);                                                 \
  }                                                                                      \
  RET log_prob_propto_jacobian(ARG& p, std::ostream* m) const override {                 \
    ++COUNTER;                                                                           \
    return inner_.log_prob_propto_jacobian(p, m);                                        \
  }
#define STANVI_FORWARD_LOG_PROB_STD(RET, ARG, COUNTER)                                   \
  RET log_prob(ARG& p, std::vector<int>& i, std::ostream* m) const override {            \
    ++COUNTER;                                                                           \
    return inner_.log_prob(p, i, m);                                                     \
  }                                                                                      \
  RET log_prob_jacobian(ARG& p, std::vector<int>& i, std::ostream* m) const override {   \
    ++COUNTER;                                                                           \
    return inner_.log_prob_jacobian(p, i, m);                                            \
  }                                                                                      \
  RET log_prob_propto(ARG& p, std::vector<int>& i, std::ostream* m) const override {     \
    ++COUNTER;                                                                           \
    return inner_.log_prob_propto(p, i, m);                                              \
  }                                                                                      \
  RET log_prob_propto_jacobian(ARG& p, std::vector<int>& i, std::ostream* m)             \
      const override {                                                                   \
    ++COUNTER;                                                                           \
    return inner_.log_prob_propto_jacobian(p, i, m);                                     \
  }

  STANVI_FORWARD_LOG_PROB(double, Eigen::VectorXd, density)
  STANVI_FORWARD_LOG_PROB(stan::math::var, STANVI_VAR_VECTOR, gradient)
  STANVI_FORWARD_LOG_PROB_STD(double, std::vector<double>, density)
  STANVI_FORWARD_LOG_PROB_STD(stan::math::var, std::vector<stan::math::var>, gradient)
#ifdef STAN_MODEL_FVAR_VAR
  STANVI_FORWARD_LOG_PROB(stan::math::fvar<stan::math::var>, STANVI_FVAR_VECTOR, hvp)
#endif
#undef STANVI_FORWARD_LOG_PROB
#undef STANVI_FORWARD_LOG_PROB_STD

  void transform_inits(const stan::io::var_context& context, Eigen::VectorXd& params_r,
                       std::ostream* msgs) const override {
    inner_.transform_inits(context, params_r, msgs);
  }
  void write_array(stan::rng_t& rng, Eigen::VectorXd& params_r, Eigen::VectorXd& constrained,
                   bool tp = true, bool gq = true, std::ostream* msgs = nullptr) const override {
    inner_.write_array(rng, params_r, constrained, tp, gq, msgs);
  }
  void unconstrain_array(const Eigen::VectorXd& constrained, Eigen::VectorXd& params_r,
                         std::ostream* msgs = nullptr) const override {
    inner_.unconstrain_array(constrained, params_r, msgs);
  }
  void transform_inits(const stan::io::var_context& context, std::vector<int>& params_i,
                       std::vector<double>& params_r, std::ostream* msgs) const override {
    inner_.transform_inits(context, params_i, params_r, msgs);
  }
  void write_array(stan::rng_t& rng, std::vector<double>& params_r, std::vector<int>& params_i,
                   std::vector<double>& constrained, bool tp = true, bool gq = true,
                   std::ostream* msgs = nullptr) const override {
    inner_.write_array(rng, params_r, params_i, constrained, tp, gq, msgs);
  }
  void unconstrain_array(const std::vector<double>& constrained, std::vector<double>& params_r,
                         std::ostream* msgs = nullptr) const override {
    inner_.unconstrain_array(constrained, params_r, msgs);
  }

 private:
  const stan::model::model_base& inner_;
};

// The result of one run of a Stan algorithm, handed to Python as an opaque handle.
struct stanvi_services_result {
  std::vector<std::string> names;       // draw columns
  std::vector<double> values;           // row-major draws
  long rows = 0;
  std::vector<double> diagnostics;      // row-major, e.g. ADVI's (iter, time, ELBO) rows
  long diagnostic_rows = 0;
  std::string names_csv;
  std::string messages;
  long density = 0, gradient = 0, hvp = 0;
};

namespace {

// Builds the model from JSON data; on failure sets *err and returns nullptr.
std::unique_ptr<stan::model::model_base> construct(const char* data_json, unsigned int seed,
                                                   char** err) {
  std::ostringstream construct_msgs;
  try {
    std::unique_ptr<stan::io::var_context> data = parse_json(data_json);
    return std::unique_ptr<stan::model::model_base>(&new_model(*data, seed, &construct_msgs));
  } catch (const std::exception& e) {
    set_error(err, std::string("Error in model construction: ") + e.what());
    return nullptr;
  }
}

// Stan's errors, preceded by the first few warnings (e.g. why an initial value was rejected;
// the same reason repeats for each of the 100 attempts) and by ADVI's choice of eta when its
// adaptation ended before the failure ("Success! Found best value [eta = 100] ...": which step
// size the failing run used).  Other informational lines (banners, progress) are left out.
std::string failure_message(const std::string& algorithm, int rc, const MemoryLogger& logger) {
  std::vector<std::string> shown;
  int warnings = 0;
  for (const auto& line : logger.lines) {
    if (line.rfind("info: ", 0) == 0 && line.find("Found best value [eta = ") != std::string::npos) {
      shown.push_back(line);
    } else if (warnings < 6 && line.rfind("warn: ", 0) == 0) {
      shown.push_back(line);
      ++warnings;
    }
  }
  shown.insert(shown.end(), logger.errors.begin(), logger.errors.end());
  std::string why = join(shown, "\n");
  return "Stan's " + algorithm + " failed with code " + std::to_string(rc) +
         (why.empty() ? std::string() : ":\n" + why);
}

stanvi_services_result* package(MemoryWriter& draws, MemoryWriter* diagnostics,
                                const MemoryLogger& logger, const CountingModel& counted) {
  auto* out = new stanvi_services_result();
  out->names = std::move(draws.names);
  out->values = std::move(draws.values);
  out->rows = draws.rows;
  if (diagnostics != nullptr) {
    out->diagnostics = std::move(diagnostics->values);
    out->diagnostic_rows = diagnostics->rows;
  }
  out->names_csv = join(out->names, ",");
  std::vector<std::string> all = logger.lines;
  for (const auto& m : draws.messages) {
    if (!m.empty()) all.push_back("output: " + m);
  }
  out->messages = join(all, "\n");
  out->density = counted.density.load();
  out->gradient = counted.gradient.load();
  out->hvp = counted.hvp.load();
  return out;
}

// Runs `body(counted_model, logger, draws_writer, diagnostic_writer) -> return code` with the
// model built from data, turning every failure into *err and NULL.
template <typename Body>
stanvi_services_result* run_service(const std::string& algorithm, const char* data_json,
                                    unsigned int seed, char** err, Body body) {
  try {
    ensure_autodiff_tape();
    std::unique_ptr<stan::model::model_base> model = construct(data_json, seed, err);
    if (!model) return nullptr;
    CountingModel counted(*model);
    MemoryLogger logger;
    MemoryWriter draws;
    MemoryWriter diagnostics;
    int rc = body(counted, logger, draws, diagnostics);
    if (rc != 0) {
      set_error(err, failure_message(algorithm, rc, logger));
      return nullptr;
    }
    return package(draws, &diagnostics, logger, counted);
  } catch (const std::exception& e) {
    set_error(err, "Stan's " + algorithm + " failed: " + e.what());
    return nullptr;
  } catch (...) {
    set_error(err, "Stan's " + algorithm + " failed with an unknown C++ exception");
    return nullptr;
  }
}

}  // namespace

extern "C" {

void stanvi_services_free_error_msg(char* msg) { std::free(msg); }

// One chain of NUTS with a diagonal (dense == 0) or dense (dense != 0) metric adapted during
// warmup; Stan's defaults are chosen by the caller.  `init_json` may be NULL or "" (uniform
// (-init_radius, init_radius) on the unconstrained scale).  Returns NULL and sets *err on failure.
stanvi_services_result* stanvi_nuts(
    const char* data_json, const char* init_json, unsigned int seed, unsigned int chain,
    int dense, double init_radius, int num_warmup, int num_samples, int num_thin,
    double stepsize, double stepsize_jitter, int max_depth, double delta, double gamma,
    double kappa, double t0, unsigned int init_buffer, unsigned int term_buffer,
    unsigned int window, char** err) {
  const std::string name = dense ? "NUTS (hmc_nuts_dense_e_adapt)" : "NUTS (hmc_nuts_diag_e_adapt)";
  return run_service(name, data_json, seed, err,
                     [&](CountingModel& model, MemoryLogger& logger, MemoryWriter& draws,
                         MemoryWriter&) {
    std::unique_ptr<stan::io::var_context> init = parse_json(init_json);
    stan::callbacks::interrupt interrupt;
    stan::callbacks::writer init_writer;
    stan::callbacks::writer diagnostic_writer;
    // No init_inv_metric: these overloads start from the unit metric (CmdStan's default).
    if (dense) {
      return stan::services::sample::hmc_nuts_dense_e_adapt(
          model, *init, seed, chain, init_radius, num_warmup, num_samples, num_thin,
          /*save_warmup=*/false, /*refresh=*/0, stepsize, stepsize_jitter, max_depth, delta,
          gamma, kappa, t0, init_buffer, term_buffer, window, interrupt, logger, init_writer,
          draws, diagnostic_writer);
    }
    return stan::services::sample::hmc_nuts_diag_e_adapt(
        model, *init, seed, chain, init_radius, num_warmup, num_samples, num_thin,
        /*save_warmup=*/false, /*refresh=*/0, stepsize, stepsize_jitter, max_depth, delta, gamma,
        kappa, t0, init_buffer, term_buffer, window, interrupt, logger, init_writer, draws,
        diagnostic_writer);
  });
}

// Stan's ADVI, mean-field (fullrank == 0) or full-rank, exactly as CmdStan's `variational`
// method calls it.  Draws: the first row is the approximation's mean (lp__ = 0), then
// `output_samples` draws; diagnostics: one (iter, time_in_seconds, ELBO) row per ELBO
// evaluation.
stanvi_services_result* stanvi_advi(
    const char* data_json, const char* init_json, unsigned int seed, int fullrank,
    double init_radius, int grad_samples, int elbo_samples, int max_iterations,
    double tol_rel_obj, double eta, int adapt_engaged, int adapt_iterations, int eval_elbo,
    int output_samples, char** err) {
  const std::string name = fullrank ? "ADVI (fullrank)" : "ADVI (meanfield)";
  return run_service(name, data_json, seed, err,
                     [&](CountingModel& model, MemoryLogger& logger, MemoryWriter& draws,
                         MemoryWriter& diagnostics) {
    std::unique_ptr<stan::io::var_context> init = parse_json(init_json);
    stan::callbacks::interrupt interrupt;
    stan::callbacks::writer init_writer;
    const unsigned int chain = 1;  // CmdStan's default id
    if (fullrank) {
      return stan::services::experimental::advi::fullrank(
          model, *init, seed, chain, init_radius, grad_samples, elbo_samples, max_iterations,
          tol_rel_obj, eta, adapt_engaged != 0, adapt_iterations, eval_elbo, output_samples,
          interrupt, logger, init_writer, draws, diagnostics);
    }
    return stan::services::experimental::advi::meanfield(
        model, *init, seed, chain, init_radius, grad_samples, elbo_samples, max_iterations,
        tol_rel_obj, eta, adapt_engaged != 0, adapt_iterations, eval_elbo, output_samples,
        interrupt, logger, init_writer, draws, diagnostics);
  });
}

// Pathfinder: single path (num_paths == 0, `pathfinder_lbfgs_single`, `num_draws` draws) or
// multi-path (`pathfinder_lbfgs_multi`: num_paths paths, `num_multi_draws` draws resampled by
// PSIS when psis_resample != 0).  Path k uses Stan's stream id 1 + k, as CmdStan does.
stanvi_services_result* stanvi_pathfinder(
    const char* data_json, const char* init_json, unsigned int seed, double init_radius,
    int history_size, double init_alpha, double tol_obj, double tol_rel_obj, double tol_grad,
    double tol_rel_grad, double tol_param, int num_iterations, int num_elbo_draws,
    int num_draws, int num_multi_draws, int num_paths, int psis_resample, int calculate_lp,
    char** err) {
  const std::string name = num_paths > 0 ? "Pathfinder (multi-path)" : "Pathfinder (single)";
  return run_service(name, data_json, seed, err,
                     [&](CountingModel& model, MemoryLogger& logger, MemoryWriter& draws,
                         MemoryWriter&) -> int {
    stan::callbacks::interrupt interrupt;
    stan::callbacks::structured_writer no_diagnostics;
    const unsigned int stride_id = 1;
    if (num_paths <= 0) {
      std::unique_ptr<stan::io::var_context> init = parse_json(init_json);
      stan::callbacks::writer init_writer;
      return stan::services::pathfinder::pathfinder_lbfgs_single(
          model, *init, seed, stride_id, init_radius, history_size, init_alpha, tol_obj,
          tol_rel_obj, tol_grad, tol_rel_grad, tol_param, num_iterations, num_elbo_draws,
          num_draws, /*save_iterations=*/false, /*refresh=*/0, interrupt, logger, init_writer,
          draws, no_diagnostics, calculate_lp != 0);
    }
    std::vector<std::shared_ptr<stan::io::var_context>> inits;
    for (int k = 0; k < num_paths; ++k) inits.push_back(parse_json(init_json));
    std::vector<stan::callbacks::writer> init_writers(num_paths);
    std::vector<stan::callbacks::writer> single_draws(num_paths);  // not kept (is_valid false)
    std::vector<stan::callbacks::structured_writer> single_diagnostics(num_paths);
    return stan::services::pathfinder::pathfinder_lbfgs_multi(
        model, inits, seed, stride_id, init_radius, history_size, init_alpha, tol_obj,
        tol_rel_obj, tol_grad, tol_rel_grad, tol_param, num_iterations, num_elbo_draws,
        num_draws, num_multi_draws, num_paths, /*save_iterations=*/false, /*refresh=*/0,
        interrupt, logger, init_writers, single_draws, single_diagnostics, draws,
        no_diagnostics, calculate_lp != 0, psis_resample != 0);
  });
}

long stanvi_result_num_rows(const stanvi_services_result* r) { return r->rows; }

int stanvi_result_num_cols(const stanvi_services_result* r) {
  return static_cast<int>(r->names.size());
}

// Comma-separated column names (for NUTS: lp__, accept_stat__, stepsize__, treedepth__,
// n_leapfrog__, divergent__, energy__, then the constrained parameters, TPs and GQs).
const char* stanvi_result_names(const stanvi_services_result* r) { return r->names_csv.c_str(); }

// Newline-separated logger messages ("level: text") and the writer's string lines.
const char* stanvi_result_messages(const stanvi_services_result* r) { return r->messages.c_str(); }

// Copies the draws, row-major (rows x cols), into `out`.
void stanvi_result_copy_draws(const stanvi_services_result* r, double* out) {
  if (!r->values.empty()) std::memcpy(out, r->values.data(), r->values.size() * sizeof(double));
}

long stanvi_result_num_diagnostic_values(const stanvi_services_result* r) {
  return static_cast<long>(r->diagnostics.size());
}

long stanvi_result_num_diagnostic_rows(const stanvi_services_result* r) {
  return r->diagnostic_rows;
}

void stanvi_result_copy_diagnostics(const stanvi_services_result* r, double* out) {
  if (!r->diagnostics.empty()) {
    std::memcpy(out, r->diagnostics.data(), r->diagnostics.size() * sizeof(double));
  }
}

// Log-density evaluations by kind: out[0] density only, out[1] gradients, out[2] HVPs.
void stanvi_result_counts(const stanvi_services_result* r, long* out) {
  out[0] = r->density;
  out[1] = r->gradient;
  out[2] = r->hvp;
}

void stanvi_result_free(stanvi_services_result* r) { delete r; }

}  // extern "C"

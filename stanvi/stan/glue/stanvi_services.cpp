// stanvi_services.cpp: Stan's own algorithms (the stan::services layer CmdStan calls), run
// in-process on a stanvi-compiled model.  First piece: NUTS with a diagonal metric adapted during
// warmup, `stan::services::sample::hmc_nuts_diag_e_adapt` (stan/services/sample/
// hmc_nuts_diag_e_adapt.hpp; Hoffman & Gelman 2014, Betancourt 2017).
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
#include <stan/services/sample/hmc_nuts_diag_e_adapt.hpp>

#include <cstdlib>
#include <cstring>
#include <memory>
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
  void error(const std::string& m) override { add("error", m); errors.push_back(m); }
  void error(const std::stringstream& m) override { error(m.str()); }
  void fatal(const std::string& m) override { add("fatal", m); errors.push_back(m); }
  void fatal(const std::stringstream& m) override { fatal(m.str()); }

 private:
  void add(const char* level, const std::string& m) {
    if (m.empty()) return;
    lines.push_back(std::string(level) + ": " + m);
  }
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

// The result of one chain, handed to Python as an opaque handle.
struct stanvi_nuts_result {
  std::vector<std::string> names;
  std::vector<double> values;
  long rows = 0;
  std::string names_csv;
  std::string messages;
};

extern "C" {

void stanvi_services_free_error_msg(char* msg) { std::free(msg); }

// One chain of NUTS with diagonal-metric adaptation (Stan's defaults are chosen by the caller).
// `init_json` may be NULL or "" (uniform(-init_radius, init_radius) on the unconstrained scale).
// Returns NULL and sets *err on failure (bad data, no valid initial point, sampler error).
stanvi_nuts_result* stanvi_nuts_diag_e_adapt(
    const char* data_json, const char* init_json, unsigned int seed, unsigned int chain,
    double init_radius, int num_warmup, int num_samples, int num_thin, double stepsize,
    double stepsize_jitter, int max_depth, double delta, double gamma, double kappa, double t0,
    unsigned int init_buffer, unsigned int term_buffer, unsigned int window, char** err) {
  stan::model::model_base* model = nullptr;
  try {
    ensure_autodiff_tape();
    std::ostringstream construct_msgs;
    try {
      std::unique_ptr<stan::io::var_context> data = parse_json(data_json);
      model = &new_model(*data, seed, &construct_msgs);
    } catch (const std::exception& e) {
      set_error(err, std::string("Error in model construction: ") + e.what());
      return nullptr;
    }
    std::unique_ptr<stan::io::var_context> init = parse_json(init_json);
    stan::callbacks::interrupt interrupt;
    MemoryLogger logger;
    stan::callbacks::writer init_writer;
    stan::callbacks::writer diagnostic_writer;
    MemoryWriter sample_writer;
    // No init_inv_metric: this overload starts from the unit diagonal metric (CmdStan's default).
    int rc = stan::services::sample::hmc_nuts_diag_e_adapt(
        *model, *init, seed, chain, init_radius, num_warmup, num_samples, num_thin,
        /*save_warmup=*/false, /*refresh=*/0, stepsize, stepsize_jitter, max_depth, delta, gamma,
        kappa, t0, init_buffer, term_buffer, window, interrupt, logger, init_writer, sample_writer,
        diagnostic_writer);
    delete model;
    model = nullptr;
    if (rc != 0) {
      // Stan's errors, preceded by the first few other messages (e.g. why the first initial
      // value was rejected; the same reason repeats for each of the 100 attempts).
      std::vector<std::string> shown;
      for (const auto& line : logger.lines) {
        if (shown.size() == 6) break;
        if (line.rfind("error: ", 0) != 0 && line.rfind("fatal: ", 0) != 0) shown.push_back(line);
      }
      shown.insert(shown.end(), logger.errors.begin(), logger.errors.end());
      std::string why = join(shown, "\n");
      set_error(err, "Stan's NUTS (hmc_nuts_diag_e_adapt) failed with code " + std::to_string(rc) +
                         (why.empty() ? std::string() : ":\n" + why));
      return nullptr;
    }
    auto* out = new stanvi_nuts_result();
    out->names = std::move(sample_writer.names);
    out->values = std::move(sample_writer.values);
    out->rows = sample_writer.rows;
    out->names_csv = join(out->names, ",");
    std::vector<std::string> all = logger.lines;
    for (const auto& m : sample_writer.messages) {
      if (!m.empty()) all.push_back("sample: " + m);
    }
    out->messages = join(all, "\n");
    return out;
  } catch (const std::exception& e) {
    delete model;
    set_error(err, std::string("Stan's NUTS failed: ") + e.what());
    return nullptr;
  } catch (...) {
    delete model;
    set_error(err, "Stan's NUTS failed with an unknown C++ exception");
    return nullptr;
  }
}

long stanvi_nuts_num_rows(const stanvi_nuts_result* r) { return r->rows; }

int stanvi_nuts_num_cols(const stanvi_nuts_result* r) { return static_cast<int>(r->names.size()); }

// Comma-separated column names: lp__, accept_stat__, stepsize__, treedepth__, n_leapfrog__,
// divergent__, energy__, then the constrained parameters, TPs and GQs.
const char* stanvi_nuts_names(const stanvi_nuts_result* r) { return r->names_csv.c_str(); }

// Newline-separated logger messages ("level: text") and the sampler's summary lines.
const char* stanvi_nuts_messages(const stanvi_nuts_result* r) { return r->messages.c_str(); }

// Copies the draws, row-major (rows x cols), into `out`.
void stanvi_nuts_copy_draws(const stanvi_nuts_result* r, double* out) {
  if (!r->values.empty()) std::memcpy(out, r->values.data(), r->values.size() * sizeof(double));
}

void stanvi_nuts_free(stanvi_nuts_result* r) { delete r; }

}  // extern "C"

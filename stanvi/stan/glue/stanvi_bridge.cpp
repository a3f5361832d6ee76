// stanvi_bridge.cpp: the stanvi project's own implementation of the BridgeStan C ABI (the symbols
// the `bridgestan` Python client loads) plus stanvi's batched, multithreaded entry points.
//
// The glue talks to the model only through `stan::model::model_base` and the `new_model()` factory
// that stanc emits, so this file is compiled once per flag set and linked into every model library.
//
// Error convention (BridgeStan ABI): functions return 0 on success and non-zero on failure, setting
// `*err` (when err is not NULL) to a malloc'd message that `bs_free_error_msg` frees.
// Batched entry points never fail a whole batch for one bad row: each row gets a status code
// (0 ok, 1 the model threw, 2 a non-finite value) and, for failed rows, a message in a
// caller-provided buffer of `msg_len` bytes per row.
//
// Build flags: STAN_THREADS (any entry point may be called from any thread) and, when the model
// supports nested autodiff, STAN_MODEL_FVAR_VAR (exact Hessian-vector products by fvar<var>);
// without it, Hessians and HVPs are central finite differences of gradients.

#include <stan/model/model_header.hpp>
#include <stan/io/empty_var_context.hpp>
#include <stan/io/json/json_data.hpp>
#include <stan/io/random_var_context.hpp>
#include <stan/io/chained_var_context.hpp>
#include <stan/services/util/create_rng.hpp>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include "stanvi_lbfgs.hpp"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <map>
#include <mutex>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

// Provided by the stanc-generated model code linked beside this file.
stan::model::model_base& new_model(stan::io::var_context& data_context, unsigned int seed,
                                   std::ostream* msg_stream);

extern "C" {
// The bridgestan Python client compares these with its own version; match bridgestan 2.9.0.
int bs_major_version = 2;
int bs_minor_version = 9;
int bs_patch_version = 0;
}

namespace {

using Vec = Eigen::VectorXd;
using print_callback_t = void (*)(const char*, size_t);
print_callback_t print_callback = nullptr;

constexpr int kRowOk = 0;
constexpr int kRowThrew = 1;
constexpr int kRowNonFinite = 2;
constexpr int kRowGqFailed = 3;  // constrain: parameters and TPs written, generated quantities NaN

#ifdef STAN_MODEL_FVAR_VAR
constexpr bool kExactHvp = true;
#else
constexpr bool kExactHvp = false;
#endif

// Each thread that evaluates gradients needs its own autodiff tape (STAN_THREADS keeps the tape
// thread-local); the first ChainableStack object constructed on a thread creates it.
inline void ensure_autodiff_tape() {
  static thread_local stan::math::ChainableStack tape;
  (void)tape;
}

char* copy_message(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out != nullptr) std::memcpy(out, s.c_str(), s.size() + 1);
  return out;
}

void set_error(char** err, const std::string& s) {
  if (err != nullptr) *err = copy_message(s);
}

// Sends what the model printed (print() statements, warnings) to the registered callback, or to
// std::cout when none is registered.
void flush_prints(const std::ostringstream& msgs) {
  const std::string s = msgs.str();
  if (s.empty()) return;
  if (print_callback != nullptr) {
    print_callback(s.c_str(), s.size());
  } else {
    std::cout << s << std::flush;
  }
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i) out += ",";
    out += names[i];
  }
  return out;
}

std::unique_ptr<stan::io::var_context> parse_json(const char* json) {
  if (json == nullptr || json[0] == '\0') {
    return std::make_unique<stan::io::empty_var_context>();
  }
  std::istringstream in{std::string(json)};
  return std::make_unique<stan::json::json_data>(in);
}

}  // namespace

// The opaque model handle given to Python.
struct bs_model {
  stan::model::model_base* model;
  std::string name;
  std::string info;
  std::string names[2][2];  // constrained names by [include_tp][include_gq]
  std::string unc_names;
  int num[2][2];
  int unc_num;

  explicit bs_model(stan::model::model_base* m) : model(m) {
    name = model->model_name();
    std::vector<std::string> compile_info = model->model_compile_info();
    compile_info.push_back(std::string("stanvi_hvp=") + (kExactHvp ? "exact" : "finite_difference"));
    compile_info.push_back("STAN_THREADS=true");
    info = "stanvi bridge; ";
    for (const auto& line : compile_info) info += line + "\n";
    for (int tp = 0; tp < 2; ++tp) {
      for (int gq = 0; gq < 2; ++gq) {
        std::vector<std::string> n;
        model->constrained_param_names(n, tp, gq);
        names[tp][gq] = join(n);
        num[tp][gq] = static_cast<int>(n.size());
      }
    }
    std::vector<std::string> u;
    model->unconstrained_param_names(u, false, false);
    unc_names = join(u);
    unc_num = static_cast<int>(model->num_params_r());
  }
  ~bs_model() { delete model; }
};

struct bs_rng {
  stan::rng_t rng;
  explicit bs_rng(unsigned int seed) : rng(stan::services::util::create_rng(seed, 0)) {}
};

namespace {

// log p at a single point, in double or (for propto, which only autodiff types honour) in var.
double log_density_at(const stan::model::model_base& model, bool propto, bool jacobian, Vec& x,
                      std::ostream* msgs) {
  if (!propto) {
    return jacobian ? model.log_prob_jacobian(x, msgs) : model.log_prob(x, msgs);
  }
  ensure_autodiff_tape();
  stan::math::nested_rev_autodiff nested;
  Eigen::Matrix<stan::math::var, -1, 1> xv = x.cast<stan::math::var>();
  stan::math::var lp = jacobian ? model.log_prob_propto_jacobian(xv, msgs)
                                : model.log_prob_propto(xv, msgs);
  return lp.val();
}

// log p and its gradient at a single point, by reverse-mode autodiff.
double gradient_at(const stan::model::model_base& model, bool propto, bool jacobian, const Vec& x,
                   double* grad, std::ostream* msgs) {
  ensure_autodiff_tape();
  stan::math::nested_rev_autodiff nested;
  Eigen::Matrix<stan::math::var, -1, 1> xv = x.cast<stan::math::var>();
  stan::math::var lp;
  if (propto) {
    lp = jacobian ? model.log_prob_propto_jacobian(xv, msgs) : model.log_prob_propto(xv, msgs);
  } else {
    lp = jacobian ? model.log_prob_jacobian(xv, msgs) : model.log_prob(xv, msgs);
  }
  lp.grad();
  for (Eigen::Index i = 0; i < x.size(); ++i) grad[i] = xv(i).adj();
  return lp.val();
}

// log p, gradient g and Hessian-vector product H v at a single point.
// Exact build: one forward-over-reverse sweep, f(x + t v) with x var and t fvar tangent; the
// tangent's reverse pass gives H v and the value's reverse pass gives g.
// Finite-difference build: central differences of gradients with step h = cbrt(eps) scaled to x
// and v (second-order accurate; the library reports which build it is).
double fd_hvp_at(const stan::model::model_base& model, bool propto, bool jacobian, const Vec& x,
                 const Vec& v, double* grad, double* hvp, std::ostream* msgs) {
  const Eigen::Index d = x.size();
  const double value = gradient_at(model, propto, jacobian, x, grad, msgs);
  const double vnorm = v.norm();
  if (vnorm == 0.0) {
    for (Eigen::Index i = 0; i < d; ++i) hvp[i] = 0.0;
    return value;
  }
  const double h = std::cbrt(std::numeric_limits<double>::epsilon()) *
                   std::max(1.0, x.norm()) / vnorm;
  Vec gp(d), gm(d);
  Vec xp = x + h * v;
  Vec xm = x - h * v;
  gradient_at(model, propto, jacobian, xp, gp.data(), msgs);
  gradient_at(model, propto, jacobian, xm, gm.data(), msgs);
  for (Eigen::Index i = 0; i < d; ++i) hvp[i] = (gp(i) - gm(i)) / (2.0 * h);
  return value;
}

bool all_finite(const double* a, Eigen::Index n);

double hvp_at(const stan::model::model_base& model, bool propto, bool jacobian, const Vec& x,
              const Vec& v, double* grad, double* hvp, std::ostream* msgs) {
#ifdef STAN_MODEL_FVAR_VAR
  ensure_autodiff_tape();
  using stan::math::fvar;
  using stan::math::var;
  stan::math::nested_rev_autodiff nested;
  const Eigen::Index d = x.size();
  Eigen::Matrix<var, -1, 1> xv = x.cast<var>();
  Eigen::Matrix<fvar<var>, -1, 1> xf(d);
  for (Eigen::Index i = 0; i < d; ++i) xf(i) = fvar<var>(xv(i), v(i));
  fvar<var> lp;
  if (propto) {
    lp = jacobian ? model.log_prob_propto_jacobian(xf, msgs) : model.log_prob_propto(xf, msgs);
  } else {
    lp = jacobian ? model.log_prob_jacobian(xf, msgs) : model.log_prob(xf, msgs);
  }
  const double value = lp.val().val();
  stan::math::grad(lp.d().vi_);
  for (Eigen::Index i = 0; i < d; ++i) hvp[i] = xv(i).adj();
  stan::math::set_zero_all_adjoints_nested();
  stan::math::grad(lp.val().vi_);
  for (Eigen::Index i = 0; i < d; ++i) grad[i] = xv(i).adj();
  // Some Stan Math functions have nested-autodiff derivatives that are NaN where the function
  // is finite (e.g. ordered_logistic_lpmf, stan-dev/math#3016, NaN gradient and HVP): fall back
  // to reverse-mode gradients and finite differences of them for such a point rather than
  // failing the draw.
  if (std::isfinite(value) && !(all_finite(grad, d) && all_finite(hvp, d))) {
    return fd_hvp_at(model, propto, jacobian, x, v, grad, hvp, msgs);
  }
  return value;
#else
  return fd_hvp_at(model, propto, jacobian, x, v, grad, hvp, msgs);
#endif
}

bool all_finite(const double* a, Eigen::Index n) {
  for (Eigen::Index i = 0; i < n; ++i) {
    if (!std::isfinite(a[i])) return false;
  }
  return true;
}

// One TBB arena per requested thread count, created on first use and shared by every caller
// (task_arena::execute is thread-safe); building an arena per call costs tens of microseconds.
tbb::task_arena& shared_arena(int n_threads) {
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<tbb::task_arena>> arenas;
  const int key = n_threads > 0 ? n_threads : 0;
  std::lock_guard<std::mutex> lock(mutex);
  auto& arena = arenas[key];
  if (!arena) {
    // The default constructor means "automatic"; naming task_arena::automatic here would
    // odr-use a static member that the httpstan TBB build does not export.
    arena = key > 0 ? std::make_unique<tbb::task_arena>(key) : std::make_unique<tbb::task_arena>();
  }
  return *arena;
}

// Runs body(row) for rows [0, n) on a TBB arena of n_threads threads (<= 0: TBB's default).
template <typename F>
void parallel_rows(int n, int n_threads, const F& body) {
  if (n <= 0) return;
  if (n_threads == 1 || n == 1) {
    for (int i = 0; i < n; ++i) body(i);
    return;
  }
  shared_arena(n_threads).execute([&] {
    tbb::parallel_for(tbb::blocked_range<int>(0, n), [&](const tbb::blocked_range<int>& r) {
      for (int i = r.begin(); i != r.end(); ++i) body(i);
    });
  });
}

void write_row_message(char* msgs, int msg_len, int row, const std::string& s) {
  if (msgs == nullptr || msg_len <= 1) return;
  char* dst = msgs + static_cast<size_t>(row) * msg_len;
  const size_t n = std::min(s.size(), static_cast<size_t>(msg_len - 1));
  std::memcpy(dst, s.data(), n);
  dst[n] = '\0';
}

// Evaluates one row, catching every exception; returns the row status.
template <typename F>
int guarded_row(int row, char* msgs, int msg_len, const F& eval) {
  std::ostringstream out;
  int status = kRowOk;
  try {
    status = eval(out) ? kRowOk : kRowNonFinite;
    if (status == kRowNonFinite) write_row_message(msgs, msg_len, row, "non-finite value");
  } catch (const std::exception& e) {
    status = kRowThrew;
    write_row_message(msgs, msg_len, row, e.what());
  } catch (...) {
    status = kRowThrew;
    write_row_message(msgs, msg_len, row, "unknown C++ exception");
  }
  flush_prints(out);
  return status;
}

}  // namespace

extern "C" {

// ---------------------------------------------------------------- BridgeStan C ABI

bs_model* bs_model_construct(const char* data, unsigned int seed, char** err) {
  std::ostringstream msgs;
  try {
    std::unique_ptr<stan::io::var_context> context = parse_json(data);
    stan::model::model_base& m = new_model(*context, seed, &msgs);
    flush_prints(msgs);
    return new bs_model(&m);
  } catch (const std::exception& e) {
    flush_prints(msgs);
    set_error(err, std::string("Error in model construction: ") + e.what());
  } catch (...) {
    set_error(err, "Unknown error in model construction");
  }
  return nullptr;
}

void bs_model_destruct(bs_model* m) { delete m; }

void bs_free_error_msg(char* msg) { std::free(msg); }

void bs_set_print_callback(print_callback_t callback, char** err) {
  print_callback = callback;
  (void)err;
}

const char* bs_name(const bs_model* m) { return m->name.c_str(); }

const char* bs_model_info(const bs_model* m) { return m->info.c_str(); }

int bs_param_num(const bs_model* m, bool include_tp, bool include_gq) {
  return m->num[include_tp][include_gq];
}

int bs_param_unc_num(const bs_model* m) { return m->unc_num; }

const char* bs_param_names(const bs_model* m, bool include_tp, bool include_gq) {
  return m->names[include_tp][include_gq].c_str();
}

const char* bs_param_unc_names(const bs_model* m) { return m->unc_names.c_str(); }

int bs_param_constrain(const bs_model* m, bool include_tp, bool include_gq,
                       const double* theta_unc, double* theta, bs_rng* rng, char** err) {
  std::ostringstream msgs;
  try {
    if (include_gq && rng == nullptr) {
      set_error(err, "an RNG is required to compute generated quantities");
      return 1;
    }
    Vec params = Eigen::Map<const Vec>(theta_unc, m->unc_num);
    Vec out;
    stan::rng_t dummy = stan::services::util::create_rng(0, 0);
    stan::rng_t& r = rng != nullptr ? rng->rng : dummy;
    m->model->write_array(r, params, out, include_tp, include_gq, &msgs);
    flush_prints(msgs);
    Eigen::Map<Vec>(theta, out.size()) = out;
    return 0;
  } catch (const std::exception& e) {
    flush_prints(msgs);
    set_error(err, std::string("Error in param_constrain: ") + e.what());
  }
  return 1;
}

int bs_param_unconstrain(const bs_model* m, const double* theta, double* theta_unc, char** err) {
  std::ostringstream msgs;
  try {
    Vec constrained = Eigen::Map<const Vec>(theta, m->num[0][0]);
    Vec out;
    m->model->unconstrain_array(constrained, out, &msgs);
    flush_prints(msgs);
    Eigen::Map<Vec>(theta_unc, out.size()) = out;
    return 0;
  } catch (const std::exception& e) {
    flush_prints(msgs);
    set_error(err, std::string("Error in param_unconstrain: ") + e.what());
  }
  return 1;
}

int bs_param_unconstrain_json(const bs_model* m, const char* json, double* theta_unc, char** err) {
  std::ostringstream msgs;
  try {
    std::unique_ptr<stan::io::var_context> context = parse_json(json);
    Vec out;
    m->model->transform_inits(*context, out, &msgs);
    flush_prints(msgs);
    Eigen::Map<Vec>(theta_unc, out.size()) = out;
    return 0;
  } catch (const std::exception& e) {
    flush_prints(msgs);
    set_error(err, std::string("Error in param_unconstrain_json: ") + e.what());
  }
  return 1;
}

int bs_param_initialize(const bs_model* m, const char* json, bs_rng* rng, double init_radius,
                        int max_tries, bool jacobian, double* theta_unc, char** err) {
  std::ostringstream msgs;
  std::string last_error = "no attempt made";
  try {
    if (rng == nullptr) {
      set_error(err, "an RNG is required for param_initialize");
      return 1;
    }
    std::unique_ptr<stan::io::var_context> user = parse_json(json);
    const int d = m->unc_num;
    std::vector<double> grad(d);
    for (int attempt = 0; attempt < std::max(1, max_tries); ++attempt) {
      try {
        stan::io::random_var_context random(*m->model, rng->rng, init_radius, init_radius <= 0);
        stan::io::chained_var_context chained(*user, random);
        Vec x;
        m->model->transform_inits(chained, x, &msgs);
        const double lp = gradient_at(*m->model, true, jacobian, x, grad.data(), &msgs);
        if (std::isfinite(lp) && all_finite(grad.data(), d)) {
          flush_prints(msgs);
          Eigen::Map<Vec>(theta_unc, d) = x;
          return 0;
        }
        last_error = "log density or gradient not finite at the initial point";
      } catch (const std::exception& e) {
        last_error = e.what();
      }
    }
    flush_prints(msgs);
    set_error(err, "Initialization failed after " + std::to_string(max_tries) +
                       " attempts; last error: " + last_error);
  } catch (const std::exception& e) {
    flush_prints(msgs);
    set_error(err, std::string("Error in param_initialize: ") + e.what());
  }
  return 1;
}

int bs_log_density(const bs_model* m, bool propto, bool jacobian, const double* theta_unc,
                   double* lp, char** err) {
  std::ostringstream msgs;
  try {
    Vec x = Eigen::Map<const Vec>(theta_unc, m->unc_num);
    *lp = log_density_at(*m->model, propto, jacobian, x, &msgs);
    flush_prints(msgs);
    return 0;
  } catch (const std::exception& e) {
    flush_prints(msgs);
    set_error(err, std::string("Error in log_density: ") + e.what());
  }
  return 1;
}

int bs_log_density_gradient(const bs_model* m, bool propto, bool jacobian,
                            const double* theta_unc, double* val, double* grad, char** err) {
  std::ostringstream msgs;
  try {
    Vec x = Eigen::Map<const Vec>(theta_unc, m->unc_num);
    *val = gradient_at(*m->model, propto, jacobian, x, grad, &msgs);
    flush_prints(msgs);
    return 0;
  } catch (const std::exception& e) {
    flush_prints(msgs);
    set_error(err, std::string("Error in log_density_gradient: ") + e.what());
  }
  return 1;
}

int bs_log_density_hessian_vector_product(const bs_model* m, bool propto, bool jacobian,
                                          const double* theta_unc, const double* vector,
                                          double* val, double* hvp, char** err) {
  std::ostringstream msgs;
  try {
    const int d = m->unc_num;
    Vec x = Eigen::Map<const Vec>(theta_unc, d);
    Vec v = Eigen::Map<const Vec>(vector, d);
    std::vector<double> grad(d);
    *val = hvp_at(*m->model, propto, jacobian, x, v, grad.data(), hvp, &msgs);
    flush_prints(msgs);
    return 0;
  } catch (const std::exception& e) {
    flush_prints(msgs);
    set_error(err, std::string("Error in log_density_hessian_vector_product: ") + e.what());
  }
  return 1;
}

// The dense Hessian, column by column from Hessian-vector products along unit vectors
// (symmetrized, which only matters for the finite-difference build).
int bs_log_density_hessian(const bs_model* m, bool propto, bool jacobian, const double* theta_unc,
                           double* val, double* grad, double* hessian, char** err) {
  std::ostringstream msgs;
  try {
    const int d = m->unc_num;
    Vec x = Eigen::Map<const Vec>(theta_unc, d);
    Eigen::Map<Eigen::MatrixXd> h(hessian, d, d);
    Vec e = Vec::Zero(d);
    Vec column(d);
    for (int j = 0; j < d; ++j) {
      e(j) = 1.0;
      *val = hvp_at(*m->model, propto, jacobian, x, e, grad, column.data(), &msgs);
      h.col(j) = column;
      e(j) = 0.0;
    }
    Eigen::MatrixXd sym = 0.5 * (h + h.transpose());
    h = sym;
    if (d == 0) *val = log_density_at(*m->model, propto, jacobian, x, &msgs);
    flush_prints(msgs);
    return 0;
  } catch (const std::exception& e) {
    flush_prints(msgs);
    set_error(err, std::string("Error in log_density_hessian: ") + e.what());
  }
  return 1;
}

bs_rng* bs_rng_construct(unsigned int seed, char** err) {
  try {
    return new bs_rng(seed);
  } catch (const std::exception& e) {
    set_error(err, std::string("Error in rng_construct: ") + e.what());
  }
  return nullptr;
}

void bs_rng_destruct(bs_rng* rng) { delete rng; }

// ---------------------------------------------------------------- stanvi batched entry points
// Points are rows of a C-contiguous (n, d) array.  Each returns the number of failed rows.

int stanvi_hvp_is_exact() { return kExactHvp ? 1 : 0; }

int stanvi_batch_log_density(const bs_model* m, bool propto, bool jacobian, int n,
                             const double* theta, double* lp, int* status, char* msgs,
                             int msg_len, int n_threads) {
  const int d = m->unc_num;
  parallel_rows(n, n_threads, [&](int i) {
    status[i] = guarded_row(i, msgs, msg_len, [&](std::ostream& out) {
      Vec x = Eigen::Map<const Vec>(theta + static_cast<size_t>(i) * d, d);
      lp[i] = log_density_at(*m->model, propto, jacobian, x, &out);
      return std::isfinite(lp[i]);
    });
    if (status[i] != kRowOk) lp[i] = -std::numeric_limits<double>::infinity();
  });
  int failed = 0;
  for (int i = 0; i < n; ++i) failed += status[i] != kRowOk;
  return failed;
}

}  // extern "C"

namespace {

// The bodies of the gradient and HVP entry points, for rows evaluated by one model
// (stanvi_batch_*) or each row by its own model instance (stanvi_multi_*: the blocks of a
// subsampled target, spec joint_control_variate.md §7.1, in one multithreaded call).
template <typename ModelOf>
int gradient_rows(const ModelOf& model_of, int d, bool propto, bool jacobian, int n,
                  const double* theta, double* lp, double* grad, int* status, char* msgs,
                  int msg_len, int n_threads) {
  parallel_rows(n, n_threads, [&](int i) {
    double* g = grad + static_cast<size_t>(i) * d;
    status[i] = guarded_row(i, msgs, msg_len, [&](std::ostream& out) {
      Vec x = Eigen::Map<const Vec>(theta + static_cast<size_t>(i) * d, d);
      lp[i] = gradient_at(*model_of(i)->model, propto, jacobian, x, g, &out);
      return std::isfinite(lp[i]) && all_finite(g, d);
    });
    if (status[i] != kRowOk) {
      lp[i] = -std::numeric_limits<double>::infinity();
      for (int j = 0; j < d; ++j) g[j] = std::numeric_limits<double>::quiet_NaN();
    }
  });
  int failed = 0;
  for (int i = 0; i < n; ++i) failed += status[i] != kRowOk;
  return failed;
}

template <typename ModelOf>
int hvp_rows(const ModelOf& model_of, int d, bool propto, bool jacobian, int n,
             const double* theta, const double* v, double* lp, double* grad, double* hvp,
             int* status, char* msgs, int msg_len, int n_threads, bool finite_difference) {
  parallel_rows(n, n_threads, [&](int i) {
    const size_t off = static_cast<size_t>(i) * d;
    status[i] = guarded_row(i, msgs, msg_len, [&](std::ostream& out) {
      Vec x = Eigen::Map<const Vec>(theta + off, d);
      Vec dir = Eigen::Map<const Vec>(v + off, d);
      const stan::model::model_base& model = *model_of(i)->model;
      lp[i] = finite_difference
                  ? fd_hvp_at(model, propto, jacobian, x, dir, grad + off, hvp + off, &out)
                  : hvp_at(model, propto, jacobian, x, dir, grad + off, hvp + off, &out);
      return std::isfinite(lp[i]) && all_finite(grad + off, d) && all_finite(hvp + off, d);
    });
    if (status[i] != kRowOk) {
      lp[i] = -std::numeric_limits<double>::infinity();
      for (int j = 0; j < d; ++j) {
        grad[off + j] = std::numeric_limits<double>::quiet_NaN();
        hvp[off + j] = std::numeric_limits<double>::quiet_NaN();
      }
    }
  });
  int failed = 0;
  for (int i = 0; i < n; ++i) failed += status[i] != kRowOk;
  return failed;
}

// −log p and its gradient for stanvi_lbfgs::minimize, through gradient_at: log p with its
// constants and the Jacobian, as every other entry point evaluates it.  Every exception is
// caught: a point where the model throws or is not finite makes the line search back off.
struct NegLogDensity {
  const stan::model::model_base* model;
  int operator()(const Vec& x, double& f, Vec& g) const {
    std::ostringstream ignored;
    try {
      f = -gradient_at(*model, false, true, x, g.data(), &ignored);
    } catch (const std::exception&) {
      return 1;
    }
    if (!std::isfinite(f) || !all_finite(g.data(), g.size())) return 2;
    g = -g;
    return 0;
  }
};

// Whether x lies within `radius` (root mean square over coordinates, in units of 1/inv_sd) of
// one of the n_centres rows of `centres`.
bool near_a_centre(const Vec& x, int n_centres, const double* centres, const double* inv_sd,
                   double radius) {
  const Eigen::Index d = x.size();
  const double limit = radius * radius * static_cast<double>(d);
  for (int c = 0; c < n_centres; ++c) {
    double sum = 0.0;
    for (Eigen::Index j = 0; j < d; ++j) {
      const double w = (x(j) - centres[static_cast<size_t>(c) * d + j]) * inv_sd[j];
      sum += w * w;
    }
    if (sum < limit) return true;
  }
  return false;
}

}  // namespace

extern "C" {

// n independent L-BFGS paths maximizing log p (with its constants and the Jacobian) from the
// rows of `inits`: L-BFGS-B's algorithm without bounds and SciPy's defaults for `history`,
// `ftol`, `gtol` (stanvi_lbfgs.hpp).  Path i stops early at the first iterate within `radius`
// of a row of `centres` (near_a_centre; n_centres = 0: never).  Writes each path's last
// iterate, log p there, iterations, gradient evaluations and status (stanvi_lbfgs::PathStatus;
// 4: the initial point failed, its message in the path's row of `msgs`).  The paths run on
// n_threads threads, each path on one, so results do not depend on the number of threads.
// Returns the number of failed paths.
int stanvi_lbfgs_paths(const bs_model* m, int n, const double* inits, int max_iters, int history,
                       double ftol, double gtol, int n_centres, const double* centres,
                       const double* inv_sd, double radius, double* x_out, double* lp_out,
                       int* iterations, std::int64_t* evaluations, int* status, char* msgs,
                       int msg_len, int n_threads) {
  constexpr int kPathFailed = 4;
  const int d = m->unc_num;
  stanvi_lbfgs::Settings settings;
  settings.max_iters = max_iters;
  settings.max_evaluations = 2 * max_iters;
  settings.history = history;
  settings.ftol = ftol;
  settings.gtol = gtol;
  parallel_rows(n, n_threads, [&](int i) {
    evaluations[i] = 0;
    iterations[i] = 0;
    Vec x = Eigen::Map<const Vec>(inits + static_cast<size_t>(i) * d, d);
    Vec g(d);
    double f = std::numeric_limits<double>::infinity();
    NegLogDensity fun{m->model};
    try {
      status[i] = stanvi_lbfgs::minimize(
          fun, x, f, g, settings,
          [&](const Vec& z) {
            return n_centres > 0 && near_a_centre(z, n_centres, centres, inv_sd, radius);
          },
          evaluations[i], iterations[i]);
    } catch (const std::exception& e) {
      status[i] = kPathFailed;
      write_row_message(msgs, msg_len, i, std::string("L-BFGS path: ") + e.what());
    }
    Eigen::Map<Vec>(x_out + static_cast<size_t>(i) * d, d) = x;
    lp_out[i] = -f;
  });
  int failed = 0;
  for (int i = 0; i < n; ++i) failed += status[i] == kPathFailed;
  return failed;
}

int stanvi_batch_gradient(const bs_model* m, bool propto, bool jacobian, int n,
                          const double* theta, double* lp, double* grad, int* status, char* msgs,
                          int msg_len, int n_threads) {
  return gradient_rows([m](int) { return m; }, m->unc_num, propto, jacobian, n, theta, lp, grad,
                       status, msgs, msg_len, n_threads);
}

// Row i is evaluated by models[i] (instances of one model with different data and the same
// number of unconstrained parameters, checked by the caller).
int stanvi_multi_gradient(const bs_model* const* models, bool propto, bool jacobian, int n,
                          const double* theta, double* lp, double* grad, int* status, char* msgs,
                          int msg_len, int n_threads) {
  if (n == 0) return 0;
  return gradient_rows([models](int i) { return models[i]; }, models[0]->unc_num, propto,
                       jacobian, n, theta, lp, grad, status, msgs, msg_len, n_threads);
}

// finite_difference: central differences of reverse-mode gradients (3 gradients per row) even
// in the exact build, where nested autodiff can cost 10-25 gradients for some Stan Math
// functions (the caller chooses, see StanTarget's hvp_method).
int stanvi_batch_hvp(const bs_model* m, bool propto, bool jacobian, int n, const double* theta,
                     const double* v, double* lp, double* grad, double* hvp, int* status,
                     char* msgs, int msg_len, int n_threads, bool finite_difference) {
  return hvp_rows([m](int) { return m; }, m->unc_num, propto, jacobian, n, theta, v, lp, grad,
                  hvp, status, msgs, msg_len, n_threads, finite_difference);
}

int stanvi_multi_hvp(const bs_model* const* models, bool propto, bool jacobian, int n,
                     const double* theta, const double* v, double* lp, double* grad, double* hvp,
                     int* status, char* msgs, int msg_len, int n_threads,
                     bool finite_difference) {
  if (n == 0) return 0;
  return hvp_rows([models](int i) { return models[i]; }, models[0]->unc_num, propto, jacobian,
                  n, theta, v, lp, grad, hvp, status, msgs, msg_len, n_threads,
                  finite_difference);
}

// Constrained values (parameters, and optionally transformed parameters and generated
// quantities) for each row.  Row i draws its generated quantities from an RNG seeded by
// (seed, i + 1), so results do not depend on the number of threads.  When a row throws with
// generated quantities requested, it is written again without them: as Stan's writers do, the
// parameters and transformed parameters of the draw are kept and only the generated quantities
// are NaN (status kRowGqFailed, with the generated quantities' message).
int stanvi_batch_constrain(const bs_model* m, bool include_tp, bool include_gq, int n,
                           const double* theta_unc, double* out, unsigned int seed, int* status,
                           char* msgs, int msg_len, int n_threads) {
  const int d = m->unc_num;
  const int k = m->num[include_tp][include_gq];
  parallel_rows(n, n_threads, [&](int i) {
    double* row_out = out + static_cast<size_t>(i) * k;
    status[i] = guarded_row(i, msgs, msg_len, [&](std::ostream& o) {
      Vec x = Eigen::Map<const Vec>(theta_unc + static_cast<size_t>(i) * d, d);
      Vec values;
      stan::rng_t rng = stan::services::util::create_rng(seed, static_cast<unsigned int>(i) + 1);
      m->model->write_array(rng, x, values, include_tp, include_gq, &o);
      Eigen::Map<Vec>(row_out, k) = values;
      return true;
    });
    if (status[i] != kRowOk) {
      for (int j = 0; j < k; ++j) row_out[j] = std::numeric_limits<double>::quiet_NaN();
      if (include_gq) {
        const int k0 = m->num[include_tp][false];
        try {
          std::ostringstream ignored;
          Vec x = Eigen::Map<const Vec>(theta_unc + static_cast<size_t>(i) * d, d);
          Vec values;
          stan::rng_t rng = stan::services::util::create_rng(seed, static_cast<unsigned int>(i) + 1);
          m->model->write_array(rng, x, values, include_tp, false, &ignored);
          Eigen::Map<Vec>(row_out, k0) = values;
          status[i] = kRowGqFailed;
        } catch (...) {
          // the parameters or transformed parameters fail too: the whole row stays NaN
        }
      }
    }
  });
  int failed = 0;
  for (int i = 0; i < n; ++i) failed += status[i] != kRowOk;
  return failed;
}

}  // extern "C"

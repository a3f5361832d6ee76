// stanvi_ffi.cpp: XLA FFI custom calls (CPU) for the JAX bridge (stanvi/targets/jax_ffi.py).
//
// Three handlers -- log density, log density + gradient, log density + gradient + HVP over a
// batch of points -- that call a model library's batched entry points (stanvi_batch_* in
// stanvi_bridge.cpp) through function pointers.  So this file knows nothing about Stan: it is
// compiled once per (compiler, jaxlib) against jaxlib's XLA FFI headers (jax.ffi.include_dir())
// and one object serves every model.
//
// Each call gets one attribute, `state`: the index, in this object's registry of states
// (stanvi_ffi_register_state), of a StanTarget's shared state, an int64
// array owned by Python (see StanTarget._ffi_state) that holds the model handle, the entry
// points, the thread count and HVP mode, and the oracle counters that this handler bumps
// (atomically) so that `target.counter` counts draws evaluated through XLA exactly as it counts
// its own batched calls, wall time in C++ included.  The attribute is a small index, not the
// state's address, so a lowered program is the same in every process (the first target of a
// process has index 0) and XLA's persistent compilation cache can serve it to the next process.
//
// Semantics match StanTarget's batched methods bit for bit: the same entry points and thread
// count, log p<propto=false, jacobian=true>, a failed row gives -inf and NaN derivatives, a row
// with NaN input gives a NaN log density.  Per-row messages are not collected here (the
// pure_callback bridge drops them as well); StanTarget's own methods report them.

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Layout of the shared state (int64 slots); keep in sync with stanvi/targets/stan_target.py.
constexpr int64_t kMagic = 0x5354414E56494646;  // "STANVIFF"
enum Slot : int {
  kSlotMagic = 0,
  kSlotLogDensityCount = 1,
  kSlotGradientCount = 2,
  kSlotHvpCount = 3,
  kSlotNanoseconds = 4,
  kSlotThreads = 5,
  kSlotHvpMode = 6,  // -1: not chosen yet ("auto"), 0: exact, 1: finite differences
  kSlotModel = 7,
  kSlotDim = 8,
  kSlotLogDensityFn = 9,
  kSlotGradientFn = 10,
  kSlotHvpFn = 11,
  kSlotCount = 12,
};

using LogDensityFn = int (*)(const void*, bool, bool, int, const double*, double*, int*, char*,
                             int, int);
using GradientFn = int (*)(const void*, bool, bool, int, const double*, double*, double*, int*,
                           char*, int, int);
using HvpFn = int (*)(const void*, bool, bool, int, const double*, const double*, double*,
                      double*, double*, int*, char*, int, int, bool);

// StanTarget's convention: Stan's log_prob<propto=false, jacobian=true>.
constexpr bool kPropto = false;
constexpr bool kJacobian = true;

int64_t load(const int64_t* state, int slot) {
  return __atomic_load_n(state + slot, __ATOMIC_RELAXED);
}

void add(int64_t* state, int slot, int64_t n) {
  __atomic_fetch_add(state + slot, n, __ATOMIC_RELAXED);
}

// Registry of states (index -> address), filled by stanvi_ffi_register_state.
constexpr int64_t kMaxStates = 1 << 16;
std::atomic<int64_t*> g_states[kMaxStates];

// Validates the state and the points (..., D); on success sets *state_out, *n_out, *d_out.
ffi::Error check(uint64_t state_index, const ffi::Buffer<ffi::F64>& z, int64_t** state_out,
                 int* n_out, int* d_out) {
  int64_t* state = state_index < static_cast<uint64_t>(kMaxStates)
                       ? g_states[state_index].load(std::memory_order_acquire)
                       : nullptr;
  if (state == nullptr || load(state, kSlotMagic) != kMagic) {
    return ffi::Error::InvalidArgument("stanvi FFI: invalid target state");
  }
  if (load(state, kSlotModel) == 0) {
    return ffi::Error::InvalidArgument("stanvi FFI: the target's model has been released");
  }
  const auto dims = z.dimensions();
  const int64_t d = load(state, kSlotDim);
  if (dims.size() < 1 || dims.back() != d) {
    return ffi::Error::InvalidArgument("stanvi FFI: points must have shape (..., " +
                                       std::to_string(d) + ")");
  }
  int64_t n = 1;
  for (size_t i = 0; i + 1 < dims.size(); ++i) n *= dims[i];
  if (n > std::numeric_limits<int>::max() / (d > 0 ? d : 1)) {
    return ffi::Error::InvalidArgument("stanvi FFI: batch too large");
  }
  *state_out = state;
  *n_out = static_cast<int>(n);
  *d_out = static_cast<int>(d);
  return ffi::Error::Success();
}

// NaN in, NaN out: a row with a NaN coordinate gets a NaN log density (not -inf).
void nan_rows(const double* z, int n, int d, double* lp) {
  for (int i = 0; i < n; ++i) {
    const double* row = z + static_cast<size_t>(i) * d;
    for (int j = 0; j < d; ++j) {
      if (std::isnan(row[j])) {
        lp[i] = std::numeric_limits<double>::quiet_NaN();
        break;
      }
    }
  }
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Per-thread status scratch (the entry points write one int per row).
int* status_buffer(int n) {
  static thread_local std::vector<int> status;
  if (status.size() < static_cast<size_t>(n)) status.resize(n);
  return status.data();
}

// hvp_method="auto" (StanTarget._choose_hvp_method, same rule): on up to 16 rows, best of 3,
// finite differences when the exact sweep costs more than twice as much.
bool choose_finite_difference(HvpFn fn, const void* model, int threads, int n, int d,
                              const double* z, const double* v) {
  const int m = n < 16 ? n : 16;
  std::vector<double> lp(m), g(static_cast<size_t>(m) * d), hv(static_cast<size_t>(m) * d);
  std::vector<int> status(m);
  auto best = [&](bool fd) {
    int64_t b = std::numeric_limits<int64_t>::max();
    for (int rep = 0; rep < 3; ++rep) {
      const int64_t t0 = now_ns();
      fn(model, kPropto, kJacobian, m, z, v, lp.data(), g.data(), hv.data(), status.data(),
         nullptr, 0, threads, fd);
      b = std::min(b, now_ns() - t0);
    }
    return b;
  };
  const int64_t exact = best(false);
  return exact > 2 * best(true);
}

ffi::Error LogDensityImpl(ffi::Buffer<ffi::F64> z, ffi::ResultBuffer<ffi::F64> lp,
                          uint64_t state_index) {
  int64_t* state;
  int n, d;
  if (ffi::Error e = check(state_index, z, &state, &n, &d); e.failure()) return e;
  if (lp->element_count() != static_cast<size_t>(n)) {
    return ffi::Error::InvalidArgument("stanvi FFI: log density output has the wrong size");
  }
  auto fn = reinterpret_cast<LogDensityFn>(load(state, kSlotLogDensityFn));
  const void* model = reinterpret_cast<const void*>(load(state, kSlotModel));
  const int64_t t0 = now_ns();
  fn(model, kPropto, kJacobian, n, z.typed_data(), lp->typed_data(), status_buffer(n), nullptr, 0,
     static_cast<int>(load(state, kSlotThreads)));
  add(state, kSlotNanoseconds, now_ns() - t0);
  add(state, kSlotLogDensityCount, n);
  nan_rows(z.typed_data(), n, d, lp->typed_data());
  return ffi::Error::Success();
}

ffi::Error GradientImpl(ffi::Buffer<ffi::F64> z, ffi::ResultBuffer<ffi::F64> lp,
                        ffi::ResultBuffer<ffi::F64> grad, uint64_t state_index) {
  int64_t* state;
  int n, d;
  if (ffi::Error e = check(state_index, z, &state, &n, &d); e.failure()) return e;
  if (lp->element_count() != static_cast<size_t>(n) ||
      grad->element_count() != z.element_count()) {
    return ffi::Error::InvalidArgument("stanvi FFI: gradient outputs have the wrong size");
  }
  auto fn = reinterpret_cast<GradientFn>(load(state, kSlotGradientFn));
  const void* model = reinterpret_cast<const void*>(load(state, kSlotModel));
  const int64_t t0 = now_ns();
  fn(model, kPropto, kJacobian, n, z.typed_data(), lp->typed_data(), grad->typed_data(),
     status_buffer(n), nullptr, 0, static_cast<int>(load(state, kSlotThreads)));
  add(state, kSlotNanoseconds, now_ns() - t0);
  add(state, kSlotGradientCount, n);
  nan_rows(z.typed_data(), n, d, lp->typed_data());
  return ffi::Error::Success();
}

ffi::Error HvpImpl(ffi::Buffer<ffi::F64> z, ffi::Buffer<ffi::F64> v,
                   ffi::ResultBuffer<ffi::F64> lp, ffi::ResultBuffer<ffi::F64> grad,
                   ffi::ResultBuffer<ffi::F64> hvp, uint64_t state_index) {
  int64_t* state;
  int n, d;
  if (ffi::Error e = check(state_index, z, &state, &n, &d); e.failure()) return e;
  if (v.element_count() != z.element_count()) {
    return ffi::Error::InvalidArgument("stanvi FFI: directions do not match the points");
  }
  if (lp->element_count() != static_cast<size_t>(n) ||
      grad->element_count() != z.element_count() || hvp->element_count() != z.element_count()) {
    return ffi::Error::InvalidArgument("stanvi FFI: HVP outputs have the wrong size");
  }
  auto fn = reinterpret_cast<HvpFn>(load(state, kSlotHvpFn));
  const void* model = reinterpret_cast<const void*>(load(state, kSlotModel));
  const int threads = static_cast<int>(load(state, kSlotThreads));
  int64_t mode = load(state, kSlotHvpMode);
  if (mode < 0 && n > 0) {
    mode = choose_finite_difference(fn, model, threads, n, d, z.typed_data(), v.typed_data());
    __atomic_store_n(state + kSlotHvpMode, mode, __ATOMIC_RELAXED);
  }
  const int64_t t0 = now_ns();
  fn(model, kPropto, kJacobian, n, z.typed_data(), v.typed_data(), lp->typed_data(),
     grad->typed_data(), hvp->typed_data(), status_buffer(n), nullptr, 0, threads, mode == 1);
  add(state, kSlotNanoseconds, now_ns() - t0);
  add(state, kSlotHvpCount, n);
  nan_rows(z.typed_data(), n, d, lp->typed_data());
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(StanviLogDensity, LogDensityImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Ret<ffi::Buffer<ffi::F64>>()
                                  .Attr<uint64_t>("state"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(StanviGradient, GradientImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Ret<ffi::Buffer<ffi::F64>>()
                                  .Ret<ffi::Buffer<ffi::F64>>()
                                  .Attr<uint64_t>("state"));

XLA_FFI_DEFINE_HANDLER_SYMBOL(StanviHvp, HvpImpl,
                              ffi::Ffi::Bind()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Arg<ffi::Buffer<ffi::F64>>()
                                  .Ret<ffi::Buffer<ffi::F64>>()
                                  .Ret<ffi::Buffer<ffi::F64>>()
                                  .Ret<ffi::Buffer<ffi::F64>>()
                                  .Attr<uint64_t>("state"));

// Registers a StanTarget's state under `index` (0 <= index < stanvi_ffi_max_states()); the
// `state` attribute of a call names it by that index.  Returns 0, or -1 for an index out of range.
extern "C" int stanvi_ffi_register_state(int64_t index, int64_t* state) {
  if (index < 0 || index >= kMaxStates) return -1;
  g_states[index].store(state, std::memory_order_release);
  return 0;
}

extern "C" int64_t stanvi_ffi_max_states() { return kMaxStates; }

// The layout version the Python side checks before using this object.
extern "C" int stanvi_ffi_state_slots() { return kSlotCount; }

// stanvi_lbfgs.hpp: L-BFGS without bounds, as SciPy's L-BFGS-B runs it with no bounds (Byrd, Lu,
// Nocedal & Zhu 1995: the quasi-Newton direction of the last `history` pairs, Moré & Thuente's
// line search dcsrch with ftol 1e-3, gtol 0.9, xtol 0.1, a first step of 1/|d| and 1 after it,
// at most `max_line_search` evaluations per line search, a restart from the steepest descent
// when a line search fails, and L-BFGS-B's two convergence tests: max |g| <= gtol, or a relative
// decrease of f below ftol).  Used by stanvi_bridge.cpp's stanvi_lbfgs_paths for TrustVI's
// extra paths (docs/algorithms.md#second-start): a path costs no Python per iteration.
//
// Two departures from L-BFGS-B, both for a log density that can fail: a point where the
// function fails or is not finite is not shown to dcsrch; the trial step is halved toward the
// best step so far instead (Stan's WolfeLineSearch does the same); the direction is that of the
// two-loop recursion (Nocedal 1980), equal in exact arithmetic to L-BFGS-B's compact form with
// no active bounds.  Header only, no Stan dependency: `Fun` is a functor
// `int f(const Vec& x, double& f, Vec& g)` returning 0 where f and g are finite.

#ifndef STANVI_LBFGS_HPP
#define STANVI_LBFGS_HPP

#include <Eigen/Dense>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <deque>
#include <limits>
#include <stdexcept>
#include <vector>

namespace stanvi_lbfgs {

using Vec = Eigen::VectorXd;

enum PathStatus { kConverged = 0, kMaxIterations = 1, kLineSearchFailed = 2, kStopped = 3 };

// MINPACK-2's dcstep (Moré & Thuente 1994): a safeguarded step within the interval of
// uncertainty, updating the interval's end points (transcribed from SciPy's _dcsrch.py).
inline void dcstep(double& stx, double& fx, double& dx, double& sty, double& fy, double& dy,
                   double& stp, double fp, double dp, bool& brackt, double stpmin,
                   double stpmax) {
  auto sign = [](double v) { return static_cast<double>((v > 0) - (v < 0)); };
  const double sgnd = sign(dp) * sign(dx);
  double stpf;
  if (fp > fx) {
    const double theta = 3.0 * (fx - fp) / (stp - stx) + dx + dp;
    const double s = std::max({std::fabs(theta), std::fabs(dx), std::fabs(dp)});
    double gamma = s * std::sqrt((theta / s) * (theta / s) - (dx / s) * (dp / s));
    if (stp < stx) gamma = -gamma;
    const double p = (gamma - dx) + theta;
    const double q = ((gamma - dx) + gamma) + dp;
    const double stpc = stx + (p / q) * (stp - stx);
    const double stpq = stx + ((dx / ((fx - fp) / (stp - stx) + dx)) / 2.0) * (stp - stx);
    stpf = std::fabs(stpc - stx) <= std::fabs(stpq - stx) ? stpc : stpc + (stpq - stpc) / 2.0;
    brackt = true;
  } else if (sgnd < 0.0) {
    const double theta = 3.0 * (fx - fp) / (stp - stx) + dx + dp;
    const double s = std::max({std::fabs(theta), std::fabs(dx), std::fabs(dp)});
    double gamma = s * std::sqrt((theta / s) * (theta / s) - (dx / s) * (dp / s));
    if (stp > stx) gamma = -gamma;
    const double p = (gamma - dp) + theta;
    const double q = ((gamma - dp) + gamma) + dx;
    const double stpc = stp + (p / q) * (stx - stp);
    const double stpq = stp + (dp / (dp - dx)) * (stx - stp);
    stpf = std::fabs(stpc - stp) > std::fabs(stpq - stp) ? stpc : stpq;
    brackt = true;
  } else if (std::fabs(dp) < std::fabs(dx)) {
    const double theta = 3.0 * (fx - fp) / (stp - stx) + dx + dp;
    const double s = std::max({std::fabs(theta), std::fabs(dx), std::fabs(dp)});
    double gamma = s * std::sqrt(std::max(0.0, (theta / s) * (theta / s) - (dx / s) * (dp / s)));
    if (stp > stx) gamma = -gamma;
    const double p = (gamma - dp) + theta;
    const double q = (gamma + (dx - dp)) + gamma;
    const double r = p / q;
    double stpc;
    if (r < 0 && gamma != 0) {
      stpc = stp + r * (stx - stp);
    } else {
      stpc = stp > stx ? stpmax : stpmin;
    }
    const double stpq = stp + (dp / (dp - dx)) * (stx - stp);
    if (brackt) {
      stpf = std::fabs(stpc - stp) < std::fabs(stpq - stp) ? stpc : stpq;
      stpf = stp > stx ? std::min(stp + 0.66 * (sty - stp), stpf)
                       : std::max(stp + 0.66 * (sty - stp), stpf);
    } else {
      stpf = std::fabs(stpc - stp) > std::fabs(stpq - stp) ? stpc : stpq;
      stpf = std::min(std::max(stpf, stpmin), stpmax);
    }
  } else if (brackt) {
    const double theta = 3.0 * (fp - fy) / (sty - stp) + dy + dp;
    const double s = std::max({std::fabs(theta), std::fabs(dy), std::fabs(dp)});
    double gamma = s * std::sqrt((theta / s) * (theta / s) - (dy / s) * (dp / s));
    if (stp > sty) gamma = -gamma;
    const double p = (gamma - dp) + theta;
    const double q = ((gamma - dp) + gamma) + dy;
    stpf = stp + (p / q) * (sty - stp);
  } else {
    stpf = stp > stx ? stpmax : stpmin;
  }
  if (fp > fx) {
    sty = stp;
    fy = fp;
    dy = dp;
  } else {
    if (sgnd < 0) {
      sty = stx;
      fy = fx;
      dy = dx;
    }
    stx = stp;
    fx = fp;
    dx = dp;
  }
  stp = stpf;
}

// MINPACK-2's dcsrch (Moré & Thuente 1994), the line search of L-BFGS-B, as a state machine:
// start() once, then next() with each trial's f and directional derivative g; next() returns
// kEvaluate with the next trial step in `stp`, kDone when the step is accepted (the last trial)
// or kFailed (SciPy's _dcsrch.py transcribed; its warnings end the search as L-BFGS-B does).
class MoreThuente {
 public:
  enum Task { kEvaluate, kDone, kFailed };

  MoreThuente(double ftol, double gtol, double xtol, double stpmin, double stpmax)
      : ftol_(ftol), gtol_(gtol), xtol_(xtol), stpmin_(stpmin), stpmax_(stpmax) {}

  Task start(double stp, double f, double g) {
    if (stp < stpmin_ || stp > stpmax_ || g >= 0) return kFailed;
    brackt_ = false;
    stage_ = 1;
    finit_ = fx_ = fy_ = f;
    ginit_ = gx_ = gy_ = g;
    gtest_ = ftol_ * ginit_;
    width_ = stpmax_ - stpmin_;
    width1_ = width_ / 0.5;
    stx_ = sty_ = 0.0;
    stmin_ = 0.0;
    stmax_ = stp + 4.0 * stp;
    return kEvaluate;
  }

  Task next(double& stp, double f, double g) {
    const double ftest = finit_ + stp * gtest_;
    if (stage_ == 1 && f <= ftest && g >= 0) stage_ = 2;
    if (brackt_ && (stp <= stmin_ || stp >= stmax_)) return kDone;       // rounding errors
    if (brackt_ && stmax_ - stmin_ <= xtol_ * stmax_) return kDone;      // xtol test
    if (stp == stpmax_ && f <= ftest && g <= gtest_) return kDone;
    if (stp == stpmin_ && (f > ftest || g >= gtest_)) return kDone;
    if (f <= ftest && std::fabs(g) <= gtol_ * -ginit_) return kDone;     // convergence
    if (stage_ == 1 && f <= fx_ && f > ftest) {
      double fxm = fx_ - stx_ * gtest_, fym = fy_ - sty_ * gtest_;
      double gxm = gx_ - gtest_, gym = gy_ - gtest_;
      dcstep(stx_, fxm, gxm, sty_, fym, gym, stp, f - stp * gtest_, g - gtest_, brackt_,
             stmin_, stmax_);
      fx_ = fxm + stx_ * gtest_;
      fy_ = fym + sty_ * gtest_;
      gx_ = gxm + gtest_;
      gy_ = gym + gtest_;
    } else {
      dcstep(stx_, fx_, gx_, sty_, fy_, gy_, stp, f, g, brackt_, stmin_, stmax_);
    }
    if (brackt_) {
      if (std::fabs(sty_ - stx_) >= 0.66 * width1_) stp = stx_ + 0.5 * (sty_ - stx_);
      width1_ = width_;
      width_ = std::fabs(sty_ - stx_);
      stmin_ = std::min(stx_, sty_);
      stmax_ = std::max(stx_, sty_);
    } else {
      stmin_ = stp + 1.1 * (stp - stx_);
      stmax_ = stp + 4.0 * (stp - stx_);
    }
    stp = std::min(std::max(stp, stpmin_), stpmax_);
    if ((brackt_ && (stp <= stmin_ || stp >= stmax_)) ||
        (brackt_ && stmax_ - stmin_ <= xtol_ * stmax_)) {
      stp = stx_;
    }
    return std::isfinite(stp) ? kEvaluate : kFailed;
  }

  // The best step so far (a failed trial is moved halfway toward it).
  double best_step() const { return stx_; }

 private:
  double ftol_, gtol_, xtol_, stpmin_, stpmax_;
  bool brackt_ = false;
  int stage_ = 1;
  double finit_ = 0, ginit_ = 0, gtest_ = 0, width_ = 0, width1_ = 0;
  double stx_ = 0, fx_ = 0, gx_ = 0, sty_ = 0, fy_ = 0, gy_ = 0, stmin_ = 0, stmax_ = 0;
};

struct Settings {
  int max_iters = 1000;
  int max_evaluations = 2000;
  int history = 10;         // SciPy's maxcor
  double ftol = 2.2204460492503131e-09;
  double gtol = 1e-5;
  int max_line_search = 20;  // SciPy's maxls
};

// The L-BFGS inverse-Hessian product of the two-loop recursion (Nocedal 1980), H0 = s'y/y'y I.
inline Vec lbfgs_direction(const Vec& g, const std::deque<Vec>& s, const std::deque<Vec>& y) {
  Vec q = -g;
  const size_t m = s.size();
  if (m == 0) return q;
  std::vector<double> alpha(m), rho(m);
  for (size_t k = m; k-- > 0;) {
    rho[k] = 1.0 / y[k].dot(s[k]);
    alpha[k] = rho[k] * s[k].dot(q);
    q -= alpha[k] * y[k];
  }
  q *= s[m - 1].dot(y[m - 1]) / y[m - 1].squaredNorm();
  for (size_t k = 0; k < m; ++k) q += s[k] * (alpha[k] - rho[k] * y[k].dot(q));
  return q;
}

// Minimizes fun from x (updated in place, with f and g there) until a status of PathStatus;
// stop(x) is asked after every iteration.  `evaluations` and `iterations` are counted.
// Throws std::runtime_error when fun fails at the initial point.
template <typename Fun, typename Stop>
int minimize(Fun& fun, Vec& x, double& f, Vec& g, const Settings& o, const Stop& stop,
             std::int64_t& evaluations, int& iterations) {
  const double eps = std::numeric_limits<double>::epsilon();
  g.resize(x.size());
  ++evaluations;
  if (fun(x, f, g) != 0) {
    throw std::runtime_error("the log density or its gradient is not finite at the initial point");
  }
  iterations = 0;
  if (g.cwiseAbs().maxCoeff() <= o.gtol) return kConverged;
  std::deque<Vec> s_hist, y_hist;
  Vec x0, g0, trial_g(x.size());
  while (true) {
    const Vec d = lbfgs_direction(g, s_hist, y_hist);
    const double gd = g.dot(d);
    const double dnorm = d.norm();
    double stp = iterations == 0 ? std::min(1.0 / dnorm, 1e10) : 1.0;
    MoreThuente search(1e-3, 0.9, 0.1, 0.0, 1e10);
    bool accepted = false;
    if (gd < 0 && std::isfinite(gd) && search.start(stp, f, gd) == MoreThuente::kEvaluate) {
      x0 = x;
      g0 = g;
      const double f0 = f;
      double trial_f = f0;
      for (int n = 0; n < o.max_line_search && evaluations < o.max_evaluations; ++n) {
        const Vec trial_x = x0 + stp * d;
        ++evaluations;
        if (fun(trial_x, trial_f, trial_g) != 0) {
          stp = 0.5 * (search.best_step() + stp);   // back toward the best step (module note)
          continue;
        }
        MoreThuente::Task task = search.next(stp, trial_f, trial_g.dot(d));
        if (task == MoreThuente::kDone) {
          x = trial_x;
          f = trial_f;
          g = trial_g;
          accepted = true;
          break;
        }
        if (task == MoreThuente::kFailed) break;
      }
      if (accepted) {
        ++iterations;
        if (stop(x)) return kStopped;
        if (iterations >= o.max_iters || evaluations >= o.max_evaluations) return kMaxIterations;
        if (g.cwiseAbs().maxCoeff() <= o.gtol) return kConverged;
        if (f0 - f <= o.ftol * std::max({std::fabs(f0), std::fabs(f), 1.0})) return kConverged;
        Vec s = x - x0, y = g - g0;
        if (y.dot(s) > eps * (-gd * stp)) {   // L-BFGS-B's curvature test (y's = dr)
          s_hist.push_back(std::move(s));
          y_hist.push_back(std::move(y));
          if (static_cast<int>(s_hist.size()) > o.history) {
            s_hist.pop_front();
            y_hist.pop_front();
          }
        }
        continue;
      }
    }
    if (evaluations >= o.max_evaluations) return kMaxIterations;
    if (s_hist.empty()) return kLineSearchFailed;   // already the steepest descent
    s_hist.clear();                                 // L-BFGS-B's restart
    y_hist.clear();
  }
}

}  // namespace stanvi_lbfgs

#endif  // STANVI_LBFGS_HPP

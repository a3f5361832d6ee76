// Logistic growth dy/dt = r * y * (1 - y / K) with known initial value y0,
// solved with ode_rk45; noisy observations at T time points.
// Closed form (used to simulate the data): y(t) = K / (1 + (K / y0 - 1) exp(-r t)).
functions {
  vector logistic_rhs(real t, vector y, real r, real K) {
    vector[1] dydt;
    dydt[1] = r * y[1] * (1 - y[1] / K);
    return dydt;
  }
}
data {
  int<lower=1> T;
  real t0;
  array[T] real ts;
  real<lower=0> y0;
  array[T] real y_obs;
}
parameters {
  real<lower=0> r;
  real<lower=0> K;
  real<lower=0> sigma;
}
model {
  array[T] vector[1] y_hat = ode_rk45(logistic_rhs, [y0]', t0, ts, r, K);
  r ~ lognormal(0, 1);
  K ~ lognormal(log(10), 0.5);
  sigma ~ exponential(2);
  for (t in 1:T) {
    y_obs[t] ~ normal(y_hat[t, 1], sigma);
  }
}

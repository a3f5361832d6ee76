// A model that rejects (throws) on part of its parameter domain:
// any unconstrained point with x > 2 makes the log density evaluation fail.
// The data are centred near 1.5 so the posterior has mass close to the
// rejection boundary.
data {
  int<lower=0> N;
  vector[N] y;
}
parameters {
  real x;
  real<lower=0> sigma;
}
model {
  if (x > 2) {
    reject("x must be at most 2, got ", x);
  }
  x ~ normal(0, 5);
  sigma ~ exponential(1);
  y ~ normal(x, sigma);
}

// Hierarchical normal model with a redundant multiplicative parameterization (Gelman 2004,
// "Parameterization and Bayesian modeling"): theta = mu + xi * sigma * eta, with xi and sigma
// both free, so only their product is identified; the posterior has two mirror-image modes
// (xi, eta) -> (-xi, -eta).
data {
  int<lower=1> J;
  int<lower=1> N;
  array[N] int<lower=1, upper=J> g;
  vector[N] y;
}
parameters {
  real mu;
  real xi;
  real<lower=0> sigma;
  vector[J] eta;
  real<lower=0> sigma_y;
}
transformed parameters {
  vector[J] theta = mu + xi * sigma * eta;
}
model {
  mu ~ normal(0, 10);
  xi ~ normal(0, 1);
  sigma ~ normal(0, 5);
  eta ~ std_normal();
  sigma_y ~ normal(0, 5);
  y ~ normal(theta[g], sigma_y);
}

// Simple linear regression with transformed parameters and generated
// quantities: posterior predictive draws (RNG) and pointwise log-likelihood.
data {
  int<lower=0> N;
  vector[N] x;
  vector[N] y;
}
parameters {
  real alpha;
  real beta;
  real<lower=0> sigma;
}
transformed parameters {
  vector[N] mu = alpha + beta * x;
}
model {
  alpha ~ normal(0, 5);
  beta ~ normal(0, 5);
  sigma ~ exponential(1);
  y ~ normal(mu, sigma);
}
generated quantities {
  array[N] real y_rep = normal_rng(mu, sigma);
  vector[N] log_lik;
  for (n in 1:N) {
    log_lik[n] = normal_lpdf(y[n] | mu[n], sigma);
  }
}

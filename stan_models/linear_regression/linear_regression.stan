// Linear regression with K predictors and weakly informative priors.
data {
  int<lower=0> N;
  int<lower=1> K;
  matrix[N, K] X;
  vector[N] y;
}
parameters {
  real alpha;
  vector[K] beta;
  real<lower=0> sigma;
}
model {
  alpha ~ normal(0, 5);
  beta ~ normal(0, 5);
  sigma ~ normal(0, 2.5);  // half-normal via the lower bound
  y ~ normal_id_glm(X, alpha, beta, sigma);
}

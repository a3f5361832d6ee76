// Bayesian logistic regression without intercept, standard-normal prior (the joint control
// variate paper's Sonar/Australian model; Wang, Geffner & Domke 2024, §5.1).  Decomposable over
// the rows of (X, y) in the sense of docs/jointcv.md (N = 0 allowed, no transformed data), so
// method="jointcv" can split it into blocks.
data {
  int<lower=0> N;
  int<lower=1> K;
  matrix[N, K] X;
  array[N] int<lower=0, upper=1> y;
}
parameters {
  vector[K] beta;
}
model {
  beta ~ std_normal();
  y ~ bernoulli_logit(X * beta);
}

// Classic Bernoulli example. With a Beta(1, 1) prior and 2 successes in
// 10 trials the posterior is exactly Beta(3, 9).
data {
  int<lower=0> N;
  array[N] int<lower=0, upper=1> y;
}
parameters {
  real<lower=0, upper=1> theta;
}
model {
  theta ~ beta(1, 1);
  y ~ bernoulli(theta);
}

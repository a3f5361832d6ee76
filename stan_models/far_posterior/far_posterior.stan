// A posterior far from Stan's uniform(-2, 2) initialization: the mean sits near 1,500 and the
// scale near 20 (log scale 3), in raw units.
data {
  int<lower=1> N;
  vector[N] y;
}
parameters {
  real mu;
  real<lower=0> sigma;
}
model {
  mu ~ normal(1000, 1000);
  sigma ~ exponential(0.01);
  y ~ normal(mu, sigma);
}

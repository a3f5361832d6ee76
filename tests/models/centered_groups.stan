// A centred varying-intercept model with a uniform group scale, as ARM's radon models write
// it: log p grows without bound as sigma_a -> 0 with every a[j] = mu_a (the neck of a
// funnel), where L-BFGS on log p ends (tests/methods/test_degenerate_mode.py).
data {
  int<lower=1> N;
  int<lower=1> J;
  array[N] int<lower=1, upper=J> group;
  vector[N] y;
}
parameters {
  vector[J] a;
  real mu_a;
  real<lower=0, upper=100> sigma_a;
  real<lower=0, upper=100> sigma_y;
}
model {
  mu_a ~ normal(0, 1);
  a ~ normal(mu_a, sigma_a);
  y ~ normal(a[group], sigma_y);
}

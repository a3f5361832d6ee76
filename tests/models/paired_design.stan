// A paired design with its group means scaled by 100, as ARM's electric writes it: from the
// default start TrustVI's full-rank run stopped stuck (its ELBO model not concave) far below
// the mean-field optimum (tests/methods/test_stuck_second_start.py).
data {
  int<lower=0> N;
  int<lower=0> n_pair;
  array[N] int<lower=1, upper=n_pair> pair;
  vector[N] treatment;
  vector[N] y;
}
parameters {
  vector[n_pair] a;
  real beta;
  real mu_a;
  real<lower=0, upper=100> sigma_a;
  real<lower=0, upper=100> sigma_y;
}
model {
  mu_a ~ normal(0, 1);
  a ~ normal(100 * mu_a, sigma_a);
  beta ~ normal(0, 1);
  y ~ normal(a[pair] + beta * treatment, sigma_y);
}

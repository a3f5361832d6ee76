// Radon-style varying-intercept, varying-slope model (Gelman & Hill 2007),
// non-centered. y: log radon, x: floor indicator (0 = basement, 1 = first
// floor), county: county index. Unconstrained dimension 2 * J + 5.
data {
  int<lower=1> N;
  int<lower=1> J;
  array[N] int<lower=1, upper=J> county;
  vector[N] x;
  vector[N] y;
}
parameters {
  real mu_a;
  real mu_b;
  real<lower=0> sigma_a;
  real<lower=0> sigma_b;
  real<lower=0> sigma_y;
  vector[J] a_raw;
  vector[J] b_raw;
}
transformed parameters {
  vector[J] a = mu_a + sigma_a * a_raw;
  vector[J] b = mu_b + sigma_b * b_raw;
}
model {
  mu_a ~ normal(0, 5);
  mu_b ~ normal(0, 5);
  sigma_a ~ normal(0, 1);
  sigma_b ~ normal(0, 1);
  sigma_y ~ normal(0, 1);
  a_raw ~ std_normal();
  b_raw ~ std_normal();
  y ~ normal(a[county] + b[county] .* x, sigma_y);
}

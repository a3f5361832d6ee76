// Log-log regression on raw heights: log(weight) = a + b log(height_cm); log(height) is about
// 5.1 with sd 0.06, so a and b are correlated almost perfectly.
data {
  int<lower=1> N;
  vector<lower=0>[N] height;
  vector<lower=0>[N] weight;
}
transformed data {
  vector[N] log_height = log(height);
  vector[N] log_weight = log(weight);
}
parameters {
  real a;
  real b;
  real<lower=0> sigma;
}
model {
  log_weight ~ normal(a + b * log_height, sigma);
}

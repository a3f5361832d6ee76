// Linear regression on raw, uncentred predictors (height in cm, weight in kg, age in years)
// with flat priors: the intercept and slopes are strongly correlated, and the posterior sds
// span three orders of magnitude.
data {
  int<lower=1> N;
  vector[N] height;
  vector[N] weight;
  vector[N] age;
  vector[N] y;
}
parameters {
  real alpha;
  real b_height;
  real b_weight;
  real b_age;
  real<lower=0> sigma;
}
model {
  y ~ normal(alpha + b_height * height + b_weight * weight + b_age * age, sigma);
}

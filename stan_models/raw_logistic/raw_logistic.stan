// Logistic regression on raw-unit predictors (income in thousands, age in years) with weak
// priors: correlated coefficients on very different scales.
data {
  int<lower=1> N;
  vector<lower=0>[N] income;
  vector<lower=0>[N] age;
  array[N] int<lower=0, upper=1> y;
}
parameters {
  real alpha;
  real b_income;
  real b_age;
}
model {
  alpha ~ normal(0, 10);
  b_income ~ normal(0, 1);
  b_age ~ normal(0, 1);
  y ~ bernoulli_logit(alpha + b_income * income + b_age * age);
}

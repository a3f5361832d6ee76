// Raw-unit regression of yearly income in dollars (around 50,000) on years of schooling and
// age, flat priors: the residual scale sigma is about 10,000 while Stan's random init puts it
// between exp(-2) and exp(2), so the log density at the init is of order -1e10.
data {
  int<lower=1> N;
  vector[N] schooling;
  vector[N] age;
  vector[N] income;
}
parameters {
  real alpha;
  real b_school;
  real b_age;
  real<lower=0> sigma;
}
model {
  income ~ normal(alpha + b_school * schooling + b_age * age, sigma);
}

// Raw-unit regression with an interaction: weight (kg) on height (cm, around 170), age (years)
// and height x age, weak priors on the raw scale.  Uncentred predictors make the intercept and
// slopes nearly collinear; from Stan's random init (uniform(-2, 2) unconstrained) the first
// gradients are of order 1e6-1e9, the regime of issue 8.
data {
  int<lower=1> N;
  vector[N] height_cm;
  vector[N] age;
  vector[N] weight_kg;
}
parameters {
  real alpha;
  real b_height;
  real b_age;
  real b_height_age;
  real<lower=0> sigma;
}
model {
  alpha ~ normal(0, 100);
  b_height ~ normal(0, 10);
  b_age ~ normal(0, 10);
  b_height_age ~ normal(0, 1);
  sigma ~ exponential(0.1);
  weight_kg ~ normal(alpha + b_height * height_cm + b_age * age
                     + b_height_age * (height_cm .* age), sigma);
}

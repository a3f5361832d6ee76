// Raw-unit regression with an interaction term (height x weight, around 12,000): condition
// numbers far worse than without it; the kind of public posterior on which TrustVI used to
// report "converged" 17 nats short.
data {
  int<lower=1> N;
  vector[N] height;
  vector[N] weight;
  vector[N] y;
}
parameters {
  real alpha;
  real b_height;
  real b_weight;
  real b_inter;
  real<lower=0> sigma;
}
model {
  y ~ normal(alpha + b_height * height + b_weight * weight + b_inter * (height .* weight), sigma);
}

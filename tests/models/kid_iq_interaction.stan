// Raw-unit regression with an interaction (issue T3-2 item 1): a child's test score on the
// mother's high-school completion hs (0/1), her IQ (around 100, uncentred) and hs x IQ, flat
// priors.  At eta = 100 Stan's ADVI throws log sigma's scale far out; the model tells whether
// stanvi's ADVI fails and chooses eta as often as Stan's does.
data {
  int<lower=1> N;
  vector[N] hs;
  vector[N] iq;
  vector[N] score;
}
parameters {
  vector[4] b;
  real<lower=0> sigma;
}
model {
  score ~ normal(b[1] + b[2] * hs + b[3] * iq + b[4] * (hs .* iq), sigma);
}

// A bimodal posterior: an equal mixture of two unit-variance Gaussians at mu and -mu.
// Normalized (log Z = 0), so the ELBO of a perfect approximation is 0 and a single Gaussian
// that covers one mode has ELBO near log(1/2). Used by stanvi's mixture family (docs/discrete.md).
data {
  vector[2] mu;
  real<lower=0> sigma;
}
parameters {
  vector[2] theta;
}
model {
  target += log_mix(0.5, normal_lpdf(theta | mu, sigma), normal_lpdf(theta | -mu, sigma));
}

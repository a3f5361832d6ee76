// D independent normals with known means and standard deviations:
// the posterior is exactly N(mu, diag(sigma^2)).
data {
  int<lower=1> D;
  vector[D] mu;
  vector<lower=0>[D] sigma;
}
parameters {
  vector[D] z;
}
model {
  z ~ normal(mu, sigma);
}

// Correlated Gaussian target with known mean and covariance: the
// posterior is exactly N(m, Sigma). The Cholesky factor is computed once
// in transformed data; multi_normal_cholesky(m, L) is the same density as
// multi_normal(m, Sigma).
data {
  int<lower=1> D;
  vector[D] m;
  cov_matrix[D] Sigma;
}
transformed data {
  matrix[D, D] L = cholesky_decompose(Sigma);
}
parameters {
  vector[D] z;
}
model {
  z ~ multi_normal_cholesky(m, L);
}

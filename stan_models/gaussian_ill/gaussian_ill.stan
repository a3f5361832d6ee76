// Correlated Gaussian target, D = 50, condition number 1e6: exactly N(m, Sigma) with
// Sigma = Q diag(lambda) Q' built here from the data (Q a rotation, lambda log-spaced over
// [1e-3, 1e3]). The density is normalized (propto = false keeps every constant), so the
// mean-field optimum is known in closed form: mu = m, sigma_i = 1/sqrt(Lambda_ii) with
// Lambda = inverse(Sigma), ELBO = -(log|Sigma| + sum(log Lambda_ii)) / 2.
data {
  int<lower=1> D;
  vector[D] m;
  matrix[D, D] Q;
  vector<lower=0>[D] lambda;
}
transformed data {
  matrix[D, D] Sigma = Q * diag_matrix(lambda) * Q';
  matrix[D, D] L = cholesky_decompose(0.5 * (Sigma + Sigma'));
}
parameters {
  vector[D] z;
}
model {
  z ~ multi_normal_cholesky(m, L);
}

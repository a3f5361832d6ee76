// Exercises the constraining transforms: ordered, simplex,
// cholesky_factor_corr and lower-bounded vectors, in three independent pieces.
//   1. ordered-logistic regression: ordered[K_ord - 1] cutpoints c
//   2. Dirichlet-multinomial: simplex[K_mult] pi
//   3. multivariate normal with an LKJ prior: cholesky_factor_corr[3] L_Omega
// Unconstrained dimension:
//   P + (K_ord - 1) + (K_mult - 1) + D + D + D * (D - 1) / 2
//   = 2 + 3 + 3 + 3 + 3 + 3 = 17 with the shipped data.
data {
  // 1. ordinal regression
  int<lower=0> N_ord;
  int<lower=1> P;
  int<lower=3> K_ord;
  matrix[N_ord, P] X;
  array[N_ord] int<lower=1, upper=K_ord> y_ord;
  // 2. multinomial counts
  int<lower=0> M;
  int<lower=2> K_mult;
  array[M, K_mult] int<lower=0> counts;
  // 3. multivariate normal
  int<lower=0> N_mvn;
  int<lower=2> D;
  array[N_mvn] vector[D] y_mvn;
}
parameters {
  vector[P] beta;
  ordered[K_ord - 1] c;
  simplex[K_mult] pi;
  vector[D] mu;
  vector<lower=0>[D] tau;
  cholesky_factor_corr[D] L_Omega;
}
model {
  // 1. ordered logistic
  beta ~ normal(0, 2.5);
  c ~ normal(0, 5);
  y_ord ~ ordered_logistic(X * beta, c);
  // 2. Dirichlet-multinomial
  pi ~ dirichlet(rep_vector(2, K_mult));
  for (m in 1:M) {
    counts[m] ~ multinomial(pi);
  }
  // 3. multivariate normal, LKJ prior on the correlation
  mu ~ normal(0, 5);
  tau ~ normal(0, 2.5);
  L_Omega ~ lkj_corr_cholesky(2);
  y_mvn ~ multi_normal_cholesky(mu, diag_pre_multiply(tau, L_Omega));
}
generated quantities {
  matrix[D, D] Omega = multiply_lower_tri_self_transpose(L_Omega);
}

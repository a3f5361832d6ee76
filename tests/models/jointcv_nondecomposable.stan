// Two programs that do not decompose over their observation rows (docs/jointcv.md, block
// scheme): kind = 1 standardizes X with its own column means in transformed data; kind = 2 is a
// Gaussian-process regression whose likelihood couples every row.  One file (a data switch) so
// the tests compile one model, not two.
data {
  int<lower=0> N;
  int<lower=1, upper=2> kind;
  vector[N] x;
  vector[N] y;
}
transformed data {
  vector[N] xs = x;
  if (kind == 1 && N > 0) {
    xs = x - mean(x);
  }
}
parameters {
  real beta;
  real<lower=0> sigma;
}
model {
  beta ~ std_normal();
  sigma ~ lognormal(0, 1);
  if (kind == 1) {
    y ~ normal(beta * xs, sigma);
  } else {
    matrix[N, N] K = add_diag(gp_exp_quad_cov(to_array_1d(x), 1.0, 1.0), square(sigma));
    y ~ multi_normal(beta * x, K);
  }
}

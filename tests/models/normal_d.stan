// x ~ normal(1, 2) in D dimensions: the full-rank scale test of issue 17 item 6
// (exact posterior: every mean 1, every sd 2, independent).
data {
  int<lower=1> D;
}
parameters {
  vector[D] x;
}
model {
  x ~ normal(1, 2);
}

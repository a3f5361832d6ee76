// Neal's funnel (Neal 2003), D = 10: v ~ N(0, 3), x[i] | v ~ N(0, exp(v / 2)).
// Exact marginal of v is N(0, 3); each x[i] has mean 0.
parameters {
  real v;
  vector[9] x;
}
model {
  v ~ normal(0, 3);
  x ~ normal(0, exp(v / 2));
}

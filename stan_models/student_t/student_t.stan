// Heavy-tailed target: D = 5 independent Student-t(nu = 5) coordinates.
// Exact answer: mean 0, sd sqrt(5 / 3) ~= 1.291 (finite kurtosis since nu > 4).
parameters {
  vector[5] z;
}
model {
  z ~ student_t(5, 0, 1);
}

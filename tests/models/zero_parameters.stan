// A model with no parameters: it loads (dim 0) but cannot be fitted (tests/stan,
// tests/test_fit.py; one compiled model for both).
data {
  real y;
}
parameters {
}
model {
}
generated quantities {
  real y2 = 2 * y;
}

// Issue 17, item 2: a model that rejects half of its parameter space.  The posterior is a
// standard normal restricted to x[1] <= 0; a Gaussian q fitted by ADVI keeps about half its
// mass where the model throws.  Zero importance ratios do not move Pareto k-hat, so the
// diagnostic must count the failed draws.
parameters {
  vector[2] x;
}
model {
  if (x[1] > 0) reject("x[1] must be <= 0");
  x ~ std_normal();
}

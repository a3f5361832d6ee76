// Every point is rejected: Stan's algorithms fail at initialization and their errors must carry
// the model's message (tests/reference: NUTS, ADVI and Pathfinder share this one compiled model).
parameters {
  real x;
}
model {
  reject("always rejects");
}

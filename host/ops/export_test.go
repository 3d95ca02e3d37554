package ops

// ThroughputSQL is Throughput's query, for the test that checks its plan.
const ThroughputSQL = throughputSQL

package sdk

// KeyForTest returns the key the host would grant for intent. It exists so
// that provider clients can be tested without a running host; handlers never
// need it, and a handler that calls it is visible in review.
func KeyForTest(intent string) IdempotencyKey {
	k, err := intentKey(intent)
	if err != nil {
		panic(err)
	}
	return k
}

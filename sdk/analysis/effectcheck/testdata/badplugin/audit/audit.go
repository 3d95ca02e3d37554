// Package audit reports to a compliance service; every call is an effect.
//
//usher:effect
package audit

// Record notes that something happened.
func Record(what string) {} // want Record:`effect: marked effect //usher:effect`

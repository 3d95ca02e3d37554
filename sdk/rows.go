package sdk

import (
	"fmt"
	"reflect"
	"time"

	"github.com/usherhq/usher/internal/contract"
	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// Rows is a query's result, read in full by the host.
type Rows struct {
	cols []string
	rows [][]any
	next int
}

func newRows(res *usherv1.StatementResult) *Rows {
	r := &Rows{cols: res.GetColumns(), rows: make([][]any, len(res.GetRows()))}
	for i, row := range res.GetRows() {
		r.rows[i] = contract.FromValues(row.GetValues())
	}
	return r
}

// Columns returns the column names.
func (r *Rows) Columns() []string { return r.cols }

// Len returns the number of rows.
func (r *Rows) Len() int { return len(r.rows) }

// Next advances to the next row; call it before the first Scan.
func (r *Rows) Next() bool {
	if r.next >= len(r.rows) {
		return false
	}
	r.next++
	return true
}

// Scan copies the current row into dest: pointers to int, int32, int64,
// float64, string, bool, []byte, time.Time or any; a pointer to a pointer
// (**string) receives nil for SQL NULL.
func (r *Rows) Scan(dest ...any) error {
	if r.next == 0 || r.next > len(r.rows) {
		return fmt.Errorf("sdk: Scan called without a successful Next")
	}
	return scanRow(r.rows[r.next-1], dest)
}

// Row is the result of QueryRow.
type Row struct {
	rows *Rows
	err  error
}

// Scan copies the first row into dest, or returns ErrNoRows.
func (r *Row) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	if !r.rows.Next() {
		return ErrNoRows
	}
	return r.rows.Scan(dest...)
}

func scanRow(row []any, dest []any) error {
	if len(dest) != len(row) {
		return fmt.Errorf("sdk: Scan got %d destinations for %d columns", len(dest), len(row))
	}
	for i, d := range dest {
		if err := assign(d, row[i]); err != nil {
			return fmt.Errorf("sdk: column %d: %w", i, err)
		}
	}
	return nil
}

func assign(dest, src any) error {
	switch d := dest.(type) {
	case *any:
		*d = src
		return nil
	case *string:
		s, ok := src.(string)
		if !ok {
			return mismatch(dest, src)
		}
		*d = s
		return nil
	case *int64:
		n, ok := src.(int64)
		if !ok {
			return mismatch(dest, src)
		}
		*d = n
		return nil
	case *int:
		n, ok := src.(int64)
		if !ok {
			return mismatch(dest, src)
		}
		*d = int(n)
		return nil
	case *int32:
		n, ok := src.(int64)
		if !ok {
			return mismatch(dest, src)
		}
		*d = int32(n)
		return nil
	case *float64:
		switch n := src.(type) {
		case float64:
			*d = n
		case int64:
			*d = float64(n)
		default:
			return mismatch(dest, src)
		}
		return nil
	case *bool:
		b, ok := src.(bool)
		if !ok {
			return mismatch(dest, src)
		}
		*d = b
		return nil
	case *[]byte:
		switch b := src.(type) {
		case []byte:
			*d = b
		case string:
			*d = []byte(b)
		default:
			return mismatch(dest, src)
		}
		return nil
	case *time.Time:
		t, ok := src.(time.Time)
		if !ok {
			return mismatch(dest, src)
		}
		*d = t
		return nil
	}
	// A pointer to a pointer: nil for NULL, else allocate and assign.
	dv := reflect.ValueOf(dest)
	if dv.Kind() == reflect.Pointer && dv.Elem().Kind() == reflect.Pointer {
		if src == nil {
			dv.Elem().Set(reflect.Zero(dv.Elem().Type()))
			return nil
		}
		inner := reflect.New(dv.Elem().Type().Elem())
		if err := assign(inner.Interface(), src); err != nil {
			return err
		}
		dv.Elem().Set(inner)
		return nil
	}
	return fmt.Errorf("unsupported Scan destination %T", dest)
}

func mismatch(dest, src any) error {
	if src == nil {
		return fmt.Errorf("cannot scan NULL into %T (use a pointer to a pointer)", dest)
	}
	return fmt.Errorf("cannot scan %T into %T", src, dest)
}

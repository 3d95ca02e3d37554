package contract

import (
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	usherv1 "github.com/usherhq/usher/proto/usher/v1"
)

// ToValue converts a Go value into its wire form. It accepts the types a
// handler passes as SQL arguments and the types pgx returns from a row.
func ToValue(v any) (*usherv1.Value, error) {
	switch x := v.(type) {
	case nil:
		return &usherv1.Value{Kind: &usherv1.Value_Null{Null: true}}, nil
	case int:
		return intValue(int64(x)), nil
	case int8:
		return intValue(int64(x)), nil
	case int16:
		return intValue(int64(x)), nil
	case int32:
		return intValue(int64(x)), nil
	case int64:
		return intValue(x), nil
	case uint8:
		return intValue(int64(x)), nil
	case uint16:
		return intValue(int64(x)), nil
	case uint32:
		return intValue(int64(x)), nil
	case uint64:
		if x > math.MaxInt64 {
			return nil, fmt.Errorf("wire: uint64 %d overflows int64", x)
		}
		return intValue(int64(x)), nil
	case float32:
		return &usherv1.Value{Kind: &usherv1.Value_Float{Float: float64(x)}}, nil
	case float64:
		return &usherv1.Value{Kind: &usherv1.Value_Float{Float: x}}, nil
	case string:
		return textValue(x), nil
	case bool:
		return &usherv1.Value{Kind: &usherv1.Value_Bool{Bool: x}}, nil
	case []byte:
		return &usherv1.Value{Kind: &usherv1.Value_Bytes{Bytes: x}}, nil
	case time.Time:
		return &usherv1.Value{Kind: &usherv1.Value_TimeUnixNanos{TimeUnixNanos: x.UnixNano()}}, nil
	case *string:
		if x == nil {
			return ToValue(nil)
		}
		return textValue(*x), nil
	case *int64:
		if x == nil {
			return ToValue(nil)
		}
		return intValue(*x), nil
	case *time.Time:
		if x == nil {
			return ToValue(nil)
		}
		return ToValue(*x)
	case pgtype.Numeric:
		if !x.Valid {
			return ToValue(nil)
		}
		f, err := x.Float64Value()
		if err != nil {
			return nil, fmt.Errorf("wire: numeric: %w", err)
		}
		if x.Exp >= 0 && x.Int != nil {
			n := new(big.Int).Mul(x.Int, new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(x.Exp)), nil))
			if n.IsInt64() {
				return intValue(n.Int64()), nil
			}
		}
		return &usherv1.Value{Kind: &usherv1.Value_Float{Float: f.Float64}}, nil
	case [16]byte: // uuid
		return textValue(fmt.Sprintf("%x-%x-%x-%x-%x", x[0:4], x[4:6], x[6:8], x[8:10], x[10:16])), nil
	case map[string]any, []any:
		b, err := json.Marshal(x)
		if err != nil {
			return nil, fmt.Errorf("wire: json value: %w", err)
		}
		return textValue(string(b)), nil
	default:
		return nil, fmt.Errorf("wire: unsupported value type %T", v)
	}
}

// ToValues converts a list of Go values.
func ToValues(vs []any) ([]*usherv1.Value, error) {
	out := make([]*usherv1.Value, len(vs))
	for i, v := range vs {
		w, err := ToValue(v)
		if err != nil {
			return nil, fmt.Errorf("argument $%d: %w", i+1, err)
		}
		out[i] = w
	}
	return out, nil
}

// FromValue converts a wire value back into a Go value: nil, int64,
// float64, string, bool, []byte or time.Time (UTC).
func FromValue(v *usherv1.Value) any {
	switch x := v.GetKind().(type) {
	case *usherv1.Value_Int:
		return x.Int
	case *usherv1.Value_Float:
		return x.Float
	case *usherv1.Value_Text:
		return x.Text
	case *usherv1.Value_Bool:
		return x.Bool
	case *usherv1.Value_Bytes:
		return x.Bytes
	case *usherv1.Value_TimeUnixNanos:
		return time.Unix(0, x.TimeUnixNanos).UTC()
	default:
		return nil
	}
}

// FromValues converts a list of wire values.
func FromValues(vs []*usherv1.Value) []any {
	out := make([]any, len(vs))
	for i, v := range vs {
		out[i] = FromValue(v)
	}
	return out
}

func intValue(n int64) *usherv1.Value {
	return &usherv1.Value{Kind: &usherv1.Value_Int{Int: n}}
}

func textValue(s string) *usherv1.Value {
	return &usherv1.Value{Kind: &usherv1.Value_Text{Text: s}}
}

package fenceq

import (
	"reflect"
	"strings"
	"sync"
)

// uniqueFieldsByType caches, per args type, the JSON names of its fields tagged
// `unique:"true"`.
var uniqueFieldsByType sync.Map // reflect.Type → []string

// uniqueFields returns the JSON names of the fields of args tagged `unique:"true"`,
// including those of embedded structs that encoding/json promotes, or nil when none is
// tagged (then all the args count).
func uniqueFields(args JobArgs) []string {
	t := reflect.TypeOf(args)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return nil
	}
	if v, ok := uniqueFieldsByType.Load(t); ok {
		return v.([]string)
	}
	var out []string
	collectUniqueFields(t, &out)
	uniqueFieldsByType.Store(t, out)
	return out
}

func collectUniqueFields(t reflect.Type, out *[]string) {
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if f.Anonymous && name == "" && ft.Kind() == reflect.Struct {
			collectUniqueFields(ft, out) // encoding/json promotes its fields
			continue
		}
		if !f.IsExported() || f.Tag.Get("unique") != "true" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		*out = append(*out, name)
	}
}

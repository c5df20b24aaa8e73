package cluster

import (
	"reflect"
	"testing"
	"time"
)

// Equal weighs every field of BundlePolicy: one added later and left out
// of Equal fails here.
func TestBundlePolicy_EqualWeighsEveryField(t *testing.T) {
	base := BundlePolicy{ApprovedDigest: "sha256:aa", Schedule: "Manual", ExcludedNodes: []string{"w1"}, NotReadyTimeout: time.Minute}
	if !base.Equal(base) {
		t.Fatal("a policy differs from itself")
	}
	typ := reflect.TypeOf(base)
	for i := range typ.NumField() {
		changed := base
		f := reflect.ValueOf(&changed).Elem().Field(i)
		switch f.Kind() {
		case reflect.String:
			f.SetString(f.String() + "x")
		case reflect.Bool:
			f.SetBool(!f.Bool())
		case reflect.Int64:
			f.SetInt(f.Int() + 1)
		case reflect.Slice:
			f.Set(reflect.ValueOf([]string{"w1", "w2"}))
		default:
			t.Fatalf("field %s of kind %s: teach this test to change it", typ.Field(i).Name, f.Kind())
		}
		if base.Equal(changed) {
			t.Errorf("Equal misses field %s", typ.Field(i).Name)
		}
	}
}

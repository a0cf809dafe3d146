package transcode

import (
	"testing"
)

// Every way a request can be wrong, with the exact error it gets.
func TestEncodeErrors(t *testing.T) {
	r := demoRegistry(t)
	cases := []struct {
		msg, in string
		discard bool
		want    string
	}{
		{"demo.Nope", `{}`, false, "bad message: demo.Nope: unknown message type"},
		{"demo.Color", `{}`, false, "bad message: demo.Color: not a message type"},
		{"demo.AllKinds", ``, false, "bad message: demo.AllKinds: invalid JSON: empty input"},
		{"demo.AllKinds", `{"i32":1,}`, false, "bad message: demo.AllKinds: invalid JSON at offset 10: invalid character '}' looking for beginning of object key string"},
		{"demo.AllKinds", `{"i32":1} x`, false, "bad message: demo.AllKinds: invalid JSON at offset 11: invalid character 'x' after top-level value"},
		{"demo.AllKinds", `[1]`, false, "bad message: demo.AllKinds: expected object, got array"},
		{"demo.AllKinds", `null`, false, "bad message: demo.AllKinds: expected object, got null"},
		{"demo.AllKinds", `"s"`, false, "bad message: demo.AllKinds: expected object, got string"},
		{"demo.AllKinds", `{"nope":1}`, false, "bad message: demo.AllKinds: nope: unknown field"},
		{"demo.AllKinds", `{"inner":{"child":{"nope":1}}}`, false, "bad message: demo.AllKinds: inner.child.nope: unknown field"},
		{"demo.AllKinds", `{"items":[{},{"x":1}]}`, false, "bad message: demo.AllKinds: items[1].x: unknown field"},
		{"demo.AllKinds", `{"byId":{"3":{"y":1}}}`, false, `bad message: demo.AllKinds: byId["3"].y: unknown field`},
		{"demo.AllKinds", `{"i32":"x"}`, false, "bad message: demo.AllKinds: i32: expected int32, got string \"x\""},
		{"demo.AllKinds", `{"i32":true}`, false, "bad message: demo.AllKinds: i32: expected int32, got boolean"},
		{"demo.AllKinds", `{"i32":2147483648}`, false, "bad message: demo.AllKinds: i32: out of range for int32: 2147483648"},
		{"demo.AllKinds", `{"i32":-2147483649}`, false, "bad message: demo.AllKinds: i32: out of range for int32: -2147483649"},
		{"demo.AllKinds", `{"i32":1.5}`, false, "bad message: demo.AllKinds: i32: not an integer: 1.5"},
		{"demo.AllKinds", `{"i64":"9223372036854775808"}`, false, "bad message: demo.AllKinds: i64: out of range for int64: 9223372036854775808"},
		{"demo.AllKinds", `{"u32":-1}`, false, "bad message: demo.AllKinds: u32: out of range for uint32: -1"},
		{"demo.AllKinds", `{"u64":"18446744073709551616"}`, false, "bad message: demo.AllKinds: u64: out of range for uint64: 18446744073709551616"},
		{"demo.AllKinds", `{"sf64":{}}`, false, "bad message: demo.AllKinds: sf64: expected sfixed64, got object"},
		{"demo.AllKinds", `{"fl":1e39}`, false, "bad message: demo.AllKinds: fl: out of range for float: 1e39"},
		{"demo.AllKinds", `{"db":"abc"}`, false, "bad message: demo.AllKinds: db: expected double, got string \"abc\""},
		{"demo.AllKinds", `{"db":[]}`, false, "bad message: demo.AllKinds: db: expected double, got array"},
		{"demo.AllKinds", `{"flag":"true"}`, false, "bad message: demo.AllKinds: flag: expected bool, got string \"true\""},
		{"demo.AllKinds", `{"flag":1}`, false, "bad message: demo.AllKinds: flag: expected bool, got number 1"},
		{"demo.AllKinds", `{"text":5}`, false, "bad message: demo.AllKinds: text: expected string, got number 5"},
		{"demo.AllKinds", "{\"text\":\"\xff\"}", false, "bad message: demo.AllKinds: text: invalid UTF-8 in string"},
		{"demo.AllKinds", `{"data":"!!"}`, false, "bad message: demo.AllKinds: data: invalid base64 (bytes): \"!!\""},
		{"demo.AllKinds", `{"data":5}`, false, "bad message: demo.AllKinds: data: expected base64 string (bytes), got number"},
		{"demo.AllKinds", `{"color":"PURPLE"}`, false, "bad message: demo.AllKinds: color: unknown value \"PURPLE\" of enum demo.Color"},
		{"demo.AllKinds", `{"color":1.5}`, false, "bad message: demo.AllKinds: color: invalid number 1.5 for enum demo.Color (an int32)"},
		{"demo.AllKinds", `{"color":true}`, false, "bad message: demo.AllKinds: color: expected enum demo.Color (name or number), got boolean"},
		{"demo.AllKinds", `{"inner":5}`, false, "bad message: demo.AllKinds: inner: expected object (demo.AllKinds.Inner), got number"},
		{"demo.AllKinds", `{"inner":{"values":[1,"x"]}}`, false, "bad message: demo.AllKinds: inner.values[1]: expected int32, got string \"x\""},
		{"demo.AllKinds", `{"tags":"a"}`, false, "bad message: demo.AllKinds: tags: expected array, got string"},
		{"demo.AllKinds", `{"tags":["a",null]}`, false, "bad message: demo.AllKinds: tags[1]: expected string, got null"},
		{"demo.AllKinds", `{"big":["1","99999999999999999999"]}`, false, "bad message: demo.AllKinds: big[1]: out of range for int64: 99999999999999999999"},
		{"demo.AllKinds", `{"items":[5]}`, false, "bad message: demo.AllKinds: items[0]: expected object (demo.AllKinds.Inner), got number"},
		{"demo.AllKinds", `{"counts":[]}`, false, "bad message: demo.AllKinds: counts: expected object (map), got array"},
		{"demo.AllKinds", `{"counts":{"a":"x"}}`, false, "bad message: demo.AllKinds: counts[\"a\"]: expected int64, got string \"x\""},
		{"demo.AllKinds", `{"counts":{"a":null}}`, false, "bad message: demo.AllKinds: counts[\"a\"]: null is not a valid map value"},
		{"demo.AllKinds", `{"byId":{"x":{}}}`, false, "bad message: demo.AllKinds: byId[\"x\"]: invalid map key: expected int32, got string \"x\""},
		{"demo.AllKinds", `{"byId":{"4294967296":{}}}`, false, "bad message: demo.AllKinds: byId[\"4294967296\"]: invalid map key: out of range for int32: 4294967296"},
		{"demo.AllKinds", `{"blobs":{"yes":""}}`, false, "bad message: demo.AllKinds: blobs[\"yes\"]: invalid map key: expected bool, got string \"yes\""},
		{"demo.AllKinds", `{"choiceText":"a","choiceNum":"1"}`, false, "bad message: demo.AllKinds: choiceNum: oneof choice is already set by choiceText"},
		{"demo.AllKinds", `{"i32":1,"i32":2}`, false, "bad message: demo.AllKinds: i32: duplicate field"},
		{"demo.AllKinds", `{"i32":1,"i_32":2}`, false, "bad message: demo.AllKinds: i_32: unknown field"},
		{"demo.AllKinds", `{"at":"yesterday"}`, false, "bad message: demo.AllKinds: at: invalid google.protobuf.Timestamp \"yesterday\" (RFC 3339, e.g. \"2006-01-02T15:04:05.5Z\", years 1 to 9999)"},
		{"demo.AllKinds", `{"at":5}`, false, "bad message: demo.AllKinds: at: expected RFC 3339 string (google.protobuf.Timestamp), got number"},
		{"demo.AllKinds", `{"took":"5"}`, false, "bad message: demo.AllKinds: took: invalid google.protobuf.Duration \"5\" (seconds with an \"s\" suffix, e.g. \"1.5s\", at most 315576000000s)"},
		{"demo.AllKinds", `{"meta":[]}`, false, "bad message: demo.AllKinds: meta: expected object (google.protobuf.Struct), got array"},
		{"demo.AllKinds", `{"wrapped":"x"}`, false, "bad message: demo.AllKinds: wrapped: expected int64, got string \"x\""},
		{"demo.AllKinds", `{"maybe":"x"}`, false, "bad message: demo.AllKinds: maybe: expected int32, got string \"x\""},
		{"google.protobuf.Timestamp", `"x"`, false, "bad message: google.protobuf.Timestamp: invalid google.protobuf.Timestamp \"x\" (RFC 3339, e.g. \"2006-01-02T15:04:05.5Z\", years 1 to 9999)"},
		// discard_unknown skips unknown fields at every depth, not bad values.
		{"demo.AllKinds", `{"nope":1,"inner":{"x":[1]},"i32":"x"}`, true, "bad message: demo.AllKinds: i32: expected int32, got string \"x\""},
	}
	for _, c := range cases {
		_, err := r.Encode(c.msg, nil, []byte(c.in), EncodeOptions{DiscardUnknown: c.discard})
		got := "<nil>"
		if err != nil {
			got = err.Error()
		}
		if got != c.want {
			t.Errorf("%s %s:\n got  %s\n want %s", c.msg, c.in, got, c.want)
		}
	}
}

// discard_unknown ignores unknown fields at every depth, and (as protojson
// does) unknown enum names; it does not excuse bad values.
func TestEncodeDiscardUnknown(t *testing.T) {
	r := demoRegistry(t)
	pb, err := r.Encode("demo.AllKinds", nil, []byte(`{"nope":1,"inner":{"x":[1],"id":"k"},"i32":5,"color":"PURPLE"}`), EncodeOptions{DiscardUnknown: true})
	if err != nil {
		t.Fatal(err)
	}
	js, err := r.Decode("demo.AllKinds", nil, pb, DecodeOptions{})
	if err != nil || string(js) != `{"i32":5,"inner":{"id":"k"}}` {
		t.Fatalf("got %s, %v", js, err)
	}
}

// Every way a response can be wrong, with the exact error it gets.
func TestDecodeErrors(t *testing.T) {
	r := demoRegistry(t)
	cases := []struct {
		msg, in string
		want    string
	}{
		{"demo.Nope", "", "bad response: demo.Nope: unknown message type"},
		{"demo.HelloReply", "\xff", "bad response: demo.HelloReply: cannot parse invalid wire-format data"},
		{"demo.HelloReply", "\x0a\x05ab", "bad response: demo.HelloReply: cannot parse invalid wire-format data"},
		{"demo.HelloReply", "Hello x!", "bad response: demo.HelloReply: cannot parse invalid wire-format data"},
		{"demo.HelloReply", "\x0a\x01\xff", "bad response: demo.HelloReply: field demo.HelloReply.message contains invalid UTF-8"},
		// Timestamp seconds beyond year 9999: valid wire data, no JSON form.
		{"demo.AllKinds", "\xf2\x01\x07\x08\x80\x80\x80\x80\x80\x40", "bad response: demo.AllKinds: google.protobuf.Timestamp: seconds out of range 2199023255552"},
	}
	for _, c := range cases {
		_, err := r.Decode(c.msg, nil, []byte(c.in), DecodeOptions{})
		got := "<nil>"
		if err != nil {
			got = err.Error()
		}
		if got != c.want {
			t.Errorf("%s %q:\n got  %s\n want %s", c.msg, c.in, got, c.want)
		}
	}
	// Fields the type does not know are not an error: newer servers add them.
	js, err := r.Decode("demo.HelloReply", nil, []byte("\x0a\x01x\x10\x05\x1a\x02ab"), DecodeOptions{})
	if err != nil || string(js) != `{"message":"x"}` {
		t.Fatalf("unknown fields: %s, %v", js, err)
	}
}

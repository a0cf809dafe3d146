package nginx

import "testing"

const shapesProto3 = `syntax = "proto3";
package rv;
import "google/protobuf/struct.proto";
import "google/protobuf/type.proto";
import "google/protobuf/descriptor.proto";
import "r2p2.proto";
import "r2ed.proto";
message NV { google.protobuf.NullValue nv = 1; string s = 2; google.protobuf.Value v = 3; }
enum Al { option allow_alias = true; AL_ZERO = 0; AL_NIL = 0; AL_ONE = 1; }
message AlM { Al a = 1; }
message Resp {
  NV nv = 1;
  r2p2.G g = 2;
  r2ed.D ed = 3;
  google.protobuf.Type ty = 4;
  google.protobuf.FileDescriptorProto fdp = 5;
  AlM al = 6;
  r2ed.I edi = 7;
}
service S { rpc Echo(Resp) returns (Resp); }
`

const shapesProto2 = `syntax = "proto2";
package r2p2;
message G {
  optional group MyGroup = 1 { optional int32 x = 1; }
  repeated group Items = 2 { optional int32 y = 1; }
  optional string s = 3;
}
`

const shapesEditions = `edition = "2023";
package r2ed;
option features.field_presence = IMPLICIT;
enum Closed { option features.enum_type = CLOSED; C_ONE = 1; }
message D {
  message Inner { int32 k = 1; }
  Inner inner = 1 [features.message_encoding = DELIMITED];
  string s = 2;
  int32 x = 3 [features.field_presence = EXPLICIT];
  Closed c = 4 [features.field_presence = EXPLICIT];
}
message I { int64 n = 1; string s = 2; bytes b = 3; }
`

// TestGatewayCompatResponseBodyMoreShapes: for each response_body field
// of rv.Resp left unset, the gateway under compat = "grpc-gateway" must
// answer the bytes protojson writes for the field's nil message, with
// the gateway's marshal options (EmitUnpopulated as compat defaults,
// UseProtoNames when proto_names is set). protojson's whitespace is
// compacted before comparing (it randomises it), the key order is kept.
func TestGatewayCompatResponseBodyMoreShapes(t *testing.T) {
	compareUnsetResponseBody(t, map[string]string{"rv.proto": shapesProto3, "r2p2.proto": shapesProto2, "r2ed.proto": shapesEditions},
		[]string{"nv", "g", "ed", "ty", "fdp", "al", "edi"})
}

/* codec.c: being written. */
typedef int proto_codec_placeholder;

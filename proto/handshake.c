/* handshake.c: being written. */
typedef int proto_handshake_placeholder;

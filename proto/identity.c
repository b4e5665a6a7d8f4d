/* identity.c: being written. */
typedef int proto_identity_placeholder;

/* seal.c: being written. */
typedef int proto_seal_placeholder;

/* token.c: being written. */
typedef int proto_token_placeholder;

/* host.c: being written. */
typedef int proto_host_placeholder;

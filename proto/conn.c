/* conn.c: being written. */
typedef int proto_conn_placeholder;

module flagd-proxy/interop/go/stdio

go 1.26

#!/bin/sh
# Run nvcc under `libtool --mode=compile`: libtool appends gcc's PIC flag
# (-fPIC), which nvcc rejects; nvcc takes host-compiler flags only through
# -Xcompiler. Usage: nvcc-pic.sh NVCC [ARGS...]
nvcc=$1
shift
for arg do
    shift
    case $arg in
        -fPIC | -fpic | -fPIE | -fpie) set -- "$@" -Xcompiler "$arg" ;;
        *) set -- "$@" "$arg" ;;
    esac
done
exec "$nvcc" "$@"

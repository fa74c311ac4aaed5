#!/usr/bin/env bash
# install_consumer.sh --build=DIR --source=DIR ... - installs a build of metrale-gpu into a fresh
# prefix under the build directory and builds tests/consumer/consumer.c against the installed
# tree four ways, running each program:
#   cmake-shared    find_package(metrale_gpu) with CMAKE_PREFIX_PATH, metrale_gpu::metrale_gpu
#   cmake-static    the same project, metrale_gpu::metrale_gpu_static
#   pkg-config      cc consumer.c $(pkg-config --cflags --libs metrale_gpu), rpath to the prefix
#   pkg-config-static  pkg-config --static, with the archive asked for by name (both libraries
#                   are installed side by side, and -lmetrale_gpu alone would pick the shared one)
# It also checks the installed layout (headers, soname links, archive, package files, the
# attention plugin next to the shared library when it is built) and which programs need
# libmetrale_gpu.so at run time. Run by ctest (cmake/install.cmake passes every option).
# Exits 77 when pkg-config is missing, after the CMake half passed (scripts/setup.sh installs it).
set -euo pipefail

build="" config="" source="" cmake="cmake" generator="" make_program="" cc="cc" cflags=""
readelf="readelf" pkg_config="" libdir="lib" includedir="include" version="" soversion=""
plugin=0
for arg in "$@"; do
    case "$arg" in
    --build=*) build="${arg#*=}" ;;
    --config=*) config="${arg#*=}" ;;
    --source=*) source="${arg#*=}" ;;
    --cmake=*) cmake="${arg#*=}" ;;
    --generator=*) generator="${arg#*=}" ;;
    --make-program=*) make_program="${arg#*=}" ;;
    --cc=*) cc="${arg#*=}" ;;
    --cflags=*) cflags="${arg#*=}" ;;
    --readelf=*) readelf="${arg#*=}" ;;
    --pkg-config=*) pkg_config="${arg#*=}" ;;
    --libdir=*) libdir="${arg#*=}" ;;
    --includedir=*) includedir="${arg#*=}" ;;
    --version=*) version="${arg#*=}" ;;
    --soversion=*) soversion="${arg#*=}" ;;
    --plugin=*) plugin="${arg#*=}" ;;
    *) echo "install_consumer.sh: unknown argument $arg" >&2; exit 2 ;;
    esac
done
[ -n "$build" ] && [ -n "$source" ] && [ -n "$version" ] && [ -n "$soversion" ] || {
    echo "usage: install_consumer.sh --build=DIR --source=DIR --version=V --soversion=S ..." >&2
    exit 2
}

# Absolute install directories would put files outside the test's prefix.
for dir in "$libdir" "$includedir"; do
    case "$dir" in
    /*)
        echo "SKIP: $dir is absolute, so installing would write outside a test prefix"
        exit 77
        ;;
    esac
done

# A directory of its own, so parallel runs (ctest -j, two ctest runs) never share files.
work="$(mktemp -d "$build/install-test.XXXXXX")"
prefix="$work/prefix"
ok=0
cleanup() {
    if [ "$ok" = 1 ]; then
        rm -rf "$work"
    else
        echo "install_consumer: FAILED; the prefix and the builds are left in $work"
    fi
}
trap cleanup EXIT

step() { echo; echo "== $*"; }
fail() { echo "FAIL: $*"; exit 1; }
libpath="$prefix/$libdir"
incpath="$prefix/$includedir"
# Whether the ELF file $1 lists a NEEDED entry starting with libmetrale_gpu.
needs_metrale() { "$readelf" -d "$1" | grep 'NEEDED.*\[libmetrale_gpu' >/dev/null; }

step "cmake --install $build --prefix $prefix"
install_args=(--install "$build" --prefix "$prefix")
[ -n "$config" ] && install_args+=(--config "$config")
"$cmake" "${install_args[@]}"

step "installed layout"
for f in "$incpath"/metrale/{export,status,gpu,launch,ops_gemm,ops_attention}.h \
         "$libpath/libmetrale_gpu.a" \
         "$libpath/libmetrale_gpu.so" "$libpath/libmetrale_gpu.so.$soversion" \
         "$libpath/libmetrale_gpu.so.$version" \
         "$libpath/cmake/metrale_gpu/metrale_gpuConfig.cmake" \
         "$libpath/cmake/metrale_gpu/metrale_gpuConfigVersion.cmake" \
         "$libpath/cmake/metrale_gpu/metrale_gpuTargets.cmake" \
         "$libpath/pkgconfig/metrale_gpu.pc"; do
    [ -e "$f" ] || fail "not installed: $f"
done
[ -L "$libpath/libmetrale_gpu.so" ] || fail "libmetrale_gpu.so is not a link to the versioned file"
soname="$("$readelf" -d "$libpath/libmetrale_gpu.so.$version" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')"
[ "$soname" = "libmetrale_gpu.so.$soversion" ] || fail "SONAME is '$soname', not libmetrale_gpu.so.$soversion"
if [ "$plugin" = 1 ]; then
    [ -e "$libpath/libmetrale_gpu_attention.so" ] ||
        fail "the attention plugin is not installed next to libmetrale_gpu.so"
else
    [ ! -e "$libpath/libmetrale_gpu_attention.so" ] ||
        fail "an attention plugin was installed, but this build has none"
fi
ls -l "$libpath"
echo "ok: layout, SONAME $soname"

step "find_package(metrale_gpu) with CMAKE_PREFIX_PATH=$prefix"
configure_args=(-S "$source" -B "$work/cmake-build" "-DCMAKE_PREFIX_PATH=$prefix"
                "-DMETRALE_EXPECTED_VERSION=$version" "-DCMAKE_C_COMPILER=$cc"
                "-DCMAKE_C_FLAGS=$cflags" -DCMAKE_BUILD_TYPE=Debug
                -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
[ -n "$generator" ] && configure_args+=(-G "$generator")
[ -n "$make_program" ] && configure_args+=("-DCMAKE_MAKE_PROGRAM=$make_program")
"$cmake" "${configure_args[@]}"
found_dir="$(sed -n 's/^metrale_gpu_DIR:PATH=//p' "$work/cmake-build/CMakeCache.txt")"
[ "$found_dir" = "$libpath/cmake/metrale_gpu" ] ||
    fail "find_package found metrale_gpu in '$found_dir', not in the fresh prefix"
"$cmake" --build "$work/cmake-build"
shared_exe="$(find "$work/cmake-build" -name consumer -type f -perm -u+x | head -1)"
static_exe="$(find "$work/cmake-build" -name consumer_static -type f -perm -u+x | head -1)"
[ -n "$shared_exe" ] && [ -n "$static_exe" ] || fail "the consumer programs were not built"
needs_metrale "$shared_exe" || fail "cmake-shared: $shared_exe does not need libmetrale_gpu.so"
! needs_metrale "$static_exe" || fail "cmake-static: $static_exe needs libmetrale_gpu.so"
"$shared_exe" || fail "cmake-shared: the consumer failed"
"$static_exe" || fail "cmake-static: the consumer failed"

if [ -z "$pkg_config" ] || ! command -v "$pkg_config" >/dev/null; then
    echo "SKIP: pkg-config is not installed (scripts/setup.sh installs it); the CMake half passed"
    ok=1
    exit 77
fi

step "pkg-config with PKG_CONFIG_PATH=$libpath/pkgconfig"
export PKG_CONFIG_PATH="$libpath/pkgconfig"
pc_version="$("$pkg_config" --modversion metrale_gpu)"
[ "$pc_version" = "$version" ] || fail "pkg-config says version $pc_version, not $version"
pc_libdir="$("$pkg_config" --variable=libdir metrale_gpu)"
[ "$pc_libdir" = "$libpath" ] || fail "pkg-config libdir is $pc_libdir, not $libpath"
read -r -a pc_cflags <<< "$("$pkg_config" --cflags metrale_gpu)"
read -r -a pc_libs <<< "$("$pkg_config" --libs metrale_gpu)"
read -r -a pc_static_libs <<< "$("$pkg_config" --static --libs metrale_gpu)"
read -r -a extra <<< "$cflags"
echo "cflags: ${pc_cflags[*]}"
echo "libs: ${pc_libs[*]}"
echo "static libs: ${pc_static_libs[*]}"
warnings=(-std=c11 -Wall -Wextra -Wpedantic -Werror)

set -x
"$cc" "${warnings[@]}" "${extra[@]}" "$source/consumer.c" -o "$work/consumer-pc" \
    "${pc_cflags[@]}" "${pc_libs[@]}" -lm "-Wl,-rpath,$pc_libdir"
# Both libraries are installed: name the archive so the linker cannot take the shared one.
"$cc" "${warnings[@]}" "${extra[@]}" "$source/consumer.c" -o "$work/consumer-pc-static" \
    "${pc_cflags[@]}" "${pc_static_libs[@]/#-lmetrale_gpu/-l:libmetrale_gpu.a}" -lm
set +x
needs_metrale "$work/consumer-pc" || fail "pkg-config: consumer-pc does not need libmetrale_gpu.so"
! needs_metrale "$work/consumer-pc-static" || fail "pkg-config --static: consumer-pc-static needs libmetrale_gpu.so"
"$work/consumer-pc" || fail "pkg-config: the consumer failed"
"$work/consumer-pc-static" || fail "pkg-config --static: the consumer failed"

echo
echo "ok: installed into $prefix; consumers built with find_package and pkg-config (shared and static) run"
ok=1

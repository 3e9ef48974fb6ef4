# shellcheck shell=sh
# Sourced by scripts/arm64/sdk.sh, scripts/check-swift-6.0, scripts/build-image
# and Tests/Image/run: a private apt configuration, apart from the host's own
# apt, only to ask an archive for its candidate versions (which key the
# cached roots) and to download .debs. Release files are often past their
# Valid-Until on mirrors and snapshots, hence Check-Valid-Until false;
# nothing is installed through it, so the sandbox user is root.

# private_apt DIR ARCHITECTURE ARCHITECTURES <SOURCES
#   writes DIR/sources.list (the `deb ...` lines on standard input) and
#   DIR/apt.conf for the native ARCHITECTURE and the comma-separated
#   ARCHITECTURES, then runs apt-get update through it. Use it with
#   APT_CONFIG=DIR/apt.conf.
private_apt() {
    _dir=$1 _native=$2 _archs=$3
    mkdir -p "$_dir/state/lists/partial" "$_dir/cache/archives/partial" "$_dir/empty"
    : >"$_dir/state/status"
    cat >"$_dir/sources.list"
    cat >"$_dir/apt.conf" <<EOF
Dir::Etc::SourceList "$_dir/sources.list";
Dir::Etc::SourceParts "$_dir/empty";
Dir::Etc::Parts "$_dir/empty";
Dir::Etc::Preferences "$_dir/empty/none";
Dir::Etc::PreferencesParts "$_dir/empty";
Dir::State "$_dir/state";
Dir::State::status "$_dir/state/status";
Dir::Cache "$_dir/cache";
APT::Architecture "$_native";
APT::Architectures { $(echo "$_archs" | tr ',' '\n' | sed 's/.*/"&";/' | paste -sd' ' -) };
Acquire::Check-Valid-Until "false";
Acquire::Languages "none";
Acquire::GzipIndexes "true";
Acquire::CompressionTypes::Order { "gz"; };
APT::Sandbox::User "root";
EOF
    APT_CONFIG=$_dir/apt.conf apt-get -q -q update
}

# ferry on a fresh Debian 12: the image's build runs the README's two commands, as root.
#   docker build -t ferry .        # needs ~9 GB of memory (the demo) and no network namespaces
# scripts/install-deps.sh installs the Debian packages both need; the netns tests skip here
# (a build has no CAP_NET_ADMIN), as they do on any machine without it.
FROM debian:bookworm
COPY . /src/ferry
WORKDIR /src/ferry
RUN bash scripts/demo.sh
RUN bash scripts/test.sh

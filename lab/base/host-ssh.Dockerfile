# The lab's hosts (scripts/lab.sh up, and fleet-up for the fleet lab): the lab's base
# image (gpufleet/debian:12, lab/base/setup-rootfs.sh) plus sshd and the user Ansible
# logs in as, so the lab is reached over SSH (pipelining, ControlPersist, become through
# sudo) as real fleets are. Each host's sshd port and the lab's key are mounted by
# playbooks/lab.yml. Built by scripts/lib.sh build_lab_host_image, tagged by the hash of
# the base image's recipe and this file.
ARG BASE=gpufleet/debian:12
FROM ${BASE}
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends openssh-server >/dev/null \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /usr/share/doc/* /usr/share/man/*
# A container cannot set the audit login uid: without this, sshd's PAM session fails.
RUN sed -i 's/^session\s\+required\s\+pam_loginuid.so/session optional pam_loginuid.so/' /etc/pam.d/sshd \
 && printf '%s\n' 'PasswordAuthentication no' 'KbdInteractiveAuthentication no' 'PermitRootLogin no' \
      'UseDNS no' > /etc/ssh/sshd_config.d/00-gpufleet-lab.conf \
 && useradd -m -s /bin/bash gpufleet \
 && install -d -m 0700 -o gpufleet -g gpufleet /home/gpufleet/.ssh \
 && echo 'gpufleet ALL=(ALL) NOPASSWD: ALL' > /etc/sudoers.d/gpufleet \
 && chmod 0440 /etc/sudoers.d/gpufleet

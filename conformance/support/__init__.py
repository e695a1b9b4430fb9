"""The battery's support code: harness helpers (`harness`), sample services
(``sample_*``), each flow's fixtures and stacks (``*_support``), the inbound
pod process (`inbound_pod`) and the soak harness (`soak`). Nothing here is a
test; the test modules beside this package import it."""

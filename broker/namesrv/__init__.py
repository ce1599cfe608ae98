"""Name serving: the route table (``routes``), its remoting adapter (``processor``), the standalone name server
(``server``) and the broker's registration with name servers (``registration``)."""

package v1alpha1

// Condition types set in the status of every kubescribe object.
const (
	// ConditionReady is True when the object is reconciled and doing its job, False when it
	// cannot (the reason says why) and Unknown while the controller is still working on it.
	ConditionReady string = "Ready"

	// ConditionResourcesResolved is set on WatchRules and ClusterWatchRules: True when every
	// entry of their rules resolved to a resource the cluster serves, False when some or all
	// did not (the message names each rules[i] entry and why).
	ConditionResourcesResolved string = "ResourcesResolved"

	// ConditionSourceClusterReachable is set on GitTargets with spec.sourceCluster: True when
	// the remote cluster's apiserver answered discovery with the kubeconfig's identity, False
	// when it did not (reason Unreachable, Unauthorized or Forbidden).
	ConditionSourceClusterReachable string = "SourceClusterReachable"

	// ConditionRetargeting is set on a GitTarget whose destination (branch, path or
	// sourceCluster) changed: True while the move is in progress (spec differs from
	// status.observedDestination, or the snapshot into the new destination is not pushed yet),
	// False once it is done. The False condition's message names the old destination, whose
	// folder is left in place, until the next retarget.
	ConditionRetargeting string = "Retargeting"
)

// Reasons of the SourceClusterReachable condition.
const (
	// ReasonReachable: the remote apiserver answered.
	ReasonReachable string = "Reachable"

	// ReasonUnreachable: no answer (connection refused, DNS, timeout, TLS verification failed,
	// an unexpected server error).
	ReasonUnreachable string = "Unreachable"

	// ReasonUnauthorized: the remote apiserver did not authenticate the kubeconfig's
	// credentials (HTTP 401).
	ReasonUnauthorized string = "Unauthorized"

	// ReasonForbidden: the remote apiserver authenticated the identity but refused it
	// discovery (HTTP 403).
	ReasonForbidden string = "Forbidden"
)

// Reasons of the Retargeting condition, and of the Retargeted event.
const (
	// ReasonSnapshotPending: the old destination was torn down (streams stopped, resume
	// cursors dropped); the new one is being validated, or its snapshot is not pushed yet.
	ReasonSnapshotPending string = "SnapshotPending"

	// ReasonRetargeted: the snapshot into the new destination is pushed and
	// status.observedDestination names it. Also the reason of the Normal event recorded then.
	ReasonRetargeted string = "Retargeted"
)

// Reason of the Warning event recorded on a GitTarget whose branch was started over.
const (
	// ReasonBranchStartedOver: the branch was deleted and the server garbage-collected its
	// history, so it refused kubescribe's next push; kubescribe created the branch again from
	// the cluster (every file written again, changes not pushed yet replayed with their authors).
	ReasonBranchStartedOver string = "BranchStartedOver"
)

// Reasons of the ResourcesResolved condition.
const (
	// ReasonResolved: every entry of the rules resolved to at least one resource.
	ReasonResolved string = "Resolved"

	// ReasonPartiallyResolved: some entries resolved to nothing; the others are mirrored. The
	// message names each unresolved rules[i] entry with why: not served (yet), served in none
	// of its apiVersions, not listable and watchable, a Secret (for a GitTarget without
	// spec.encryption.age) or, in a WatchRule, cluster-scoped. It is also the reason of
	// Ready=False in that case.
	ReasonPartiallyResolved string = "PartiallyResolved"
)

// Reasons of the Ready condition. Every reason is used by the kinds named in its comment.
const (
	// ReasonReady is the reason of Ready=True on every kind: the object is reconciled and working.
	ReasonReady string = "Ready"

	// ReasonSecretNotFound: a Secret the object names (GitProvider credentials, GitTarget
	// kubeconfig) does not exist.
	ReasonSecretNotFound string = "SecretNotFound"

	// ReasonSecretInvalid: a Secret the object names lacks a required key or holds a value that
	// cannot be used (for example an unparsable ca.crt or kubeconfig).
	ReasonSecretInvalid string = "SecretInvalid"

	// ReasonSigningKeyInvalid: a GitProvider's signing Secret is missing, or holds no key that
	// can sign (unreadable, public only, expired, protected by a passphrase it lacks).
	ReasonSigningKeyInvalid string = "SigningKeyInvalid"

	// ReasonRemoteUnreachable: a GitProvider's repository could not be reached (DNS, connection,
	// TLS or an unexpected server answer).
	ReasonRemoteUnreachable string = "RemoteUnreachable"

	// ReasonAuthenticationFailed: a GitProvider's repository rejected the credentials, or
	// anonymous access was refused.
	ReasonAuthenticationFailed string = "AuthenticationFailed"

	// ReasonProviderNotFound: a GitTarget's spec.providerRef names no GitProvider in its
	// namespace.
	ReasonProviderNotFound string = "ProviderNotFound"

	// ReasonProviderNotReady: a GitTarget's GitProvider exists but is not Ready.
	ReasonProviderNotReady string = "ProviderNotReady"

	// ReasonTargetNotFound: a WatchRule's or ClusterWatchRule's spec.targetRef names no
	// GitTarget.
	ReasonTargetNotFound string = "TargetNotFound"

	// ReasonTargetNotReady: a WatchRule's or ClusterWatchRule's GitTarget exists but is not
	// Ready.
	ReasonTargetNotReady string = "TargetNotReady"

	// ReasonKubeConfigExecPlugin: a GitTarget's kubeconfig runs an exec or auth-provider
	// plugin, refused unless kubescribe runs with --allow-remote-kubeconfig-exec.
	ReasonKubeConfigExecPlugin string = "KubeConfigExecPlugin"

	// ReasonKubeConfigInsecure: a GitTarget's kubeconfig sets insecure-skip-tls-verify or names
	// a plain http:// server, refused unless kubescribe runs with
	// --allow-remote-kubeconfig-insecure.
	ReasonKubeConfigInsecure string = "KubeConfigInsecure"

	// ReasonKubeConfigFileReference: a GitTarget's kubeconfig refers to a file
	// (certificate-authority, client-certificate, client-key, tokenFile): it must carry
	// everything inline. Always refused.
	ReasonKubeConfigFileReference string = "KubeConfigFileReference"

	// ReasonKubeConfigProxy: a GitTarget's kubeconfig sets proxy-url, which would send
	// kubescribe's connections (and, for an http:// server, its credentials) through an address
	// the Secret's writer chose. Always refused: a proxy kubescribe must use is set on its
	// Deployment (HTTPS_PROXY, NO_PROXY).
	ReasonKubeConfigProxy string = "KubeConfigProxy"

	// ReasonSourceClusterConflict: a GitTarget's spec.sourceCluster.auditRoute belongs to an
	// older GitTarget (of a namespace bound to the route) reading a different kubeconfig, or is
	// the route of the cluster kubescribe runs in (--cluster-name). One audit route names one
	// cluster.
	ReasonSourceClusterConflict string = "SourceClusterConflict"

	// ReasonAuditRouteNotBound: a GitTarget's spec.sourceCluster.auditRoute is not bound to its
	// namespace by the platform (kubescribe's --audit-route-namespaces): nothing of that cluster
	// is mirrored for it, and its Secret is not read.
	ReasonAuditRouteNotBound string = "AuditRouteNotBound"

	// ReasonSecretReferenceUnverified: a GitProvider or GitTarget names a Secret (or a
	// GitTarget encrypts Secrets), and no admission record says that someone who may read the
	// Secrets created or changed it with its current spec: kubescribe does not use them.
	ReasonSecretReferenceUnverified string = "SecretReferenceUnverified"

	// ReasonSourceClusterUnreachable: a GitTarget's remote cluster does not answer, or refuses
	// the kubeconfig's identity; the condition SourceClusterReachable says how. Its watches keep
	// retrying and mirroring resumes when the cluster answers again.
	ReasonSourceClusterUnreachable string = "SourceClusterUnreachable"

	// ReasonNoResourcesMatched: a WatchRule's or ClusterWatchRule's rules resolve to no
	// resource the cluster serves (also the reason of ResourcesResolved=False then).
	ReasonNoResourcesMatched string = "NoResourcesMatched"

	// ReasonWatchFailed: a WatchRule's or ClusterWatchRule's resolved resource could not be
	// listed or watched (for example for lack of RBAC).
	ReasonWatchFailed string = "WatchFailed"

	// ReasonHostKeyRejected: the host key an SSH repository presented is not in the Secret's
	// known_hosts, or differs from the key listed there for that host. It is never accepted.
	ReasonHostKeyRejected string = "HostKeyRejected"

	// ReasonPathOverlap: a GitTarget's folder overlaps (equals, contains or lies inside) the
	// folder of another GitTarget that writes on the same repository branch; the one already
	// writing keeps it (between two that both write, the older).
	ReasonPathOverlap string = "PathOverlap"

	// ReasonPushFailed: a GitTarget's commits could not be pushed; the push is retried and
	// nothing is dropped.
	ReasonPushFailed string = "PushFailed"

	// ReasonFolderNotAdoptable: a GitTarget's folder holds content kubescribe may not write
	// into (pkg/manifestanalyzer's error codes, as `kubescribe scan` reports them: a Helm
	// chart, YAML that does not parse, a Secret in plaintext, ...). Nothing is committed for
	// the target; its changes are held and committed once the folder is fixed.
	ReasonFolderNotAdoptable string = "FolderNotAdoptable"

	// ReasonInvalidSpec: the spec is invalid in a way the CRD schema does not catch, or sets a
	// field reserved for a later release (WatchRule excludeFieldManagers/excludeUsers), or a
	// ClusterWatchRule's namespaceSelector cannot be parsed.
	ReasonInvalidSpec string = "InvalidSpec"

	// ReasonProgressing is the reason of Ready=Unknown on every kind: the controller is working
	// on the current generation (for example the first snapshot or a retarget).
	ReasonProgressing string = "Progressing"
)

package controller

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	v1alpha1 "github.com/kubescribe/kubescribe/api/v1alpha1"
	"github.com/kubescribe/kubescribe/internal/safetext"
)

var metav1UpdateOptions = metav1.UpdateOptions{FieldManager: FieldManager}

// setReady sets the Ready condition to True or False; it reports whether anything changed.
func setReady(conds *[]metav1.Condition, generation int64, ready bool, reason, format string, args ...any) bool {
	return setCondition(conds, generation, conditionStatus(ready), reason, format, args...)
}

func conditionStatus(ready bool) metav1.ConditionStatus {
	if ready {
		return metav1.ConditionTrue
	}
	return metav1.ConditionFalse
}

// setCondition sets the Ready condition; it reports whether anything changed. The message is
// stripped of control characters and escape sequences (safetext): it may name what others chose
// (a URL, a folder's files), and people read it in their terminals.
func setCondition(conds *[]metav1.Condition, generation int64, status metav1.ConditionStatus, reason, format string, args ...any) bool {
	return meta.SetStatusCondition(conds, metav1.Condition{
		Type:               v1alpha1.ConditionReady,
		Status:             status,
		ObservedGeneration: generation,
		Reason:             reason,
		Message:            safetext.Strip(fmt.Sprintf(format, args...)),
	})
}
